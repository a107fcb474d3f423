"""Moved to :mod:`mi_cli.args`; kept as an alias."""

from mi_cli.args import *  # noqa: F401,F403
from mi_cli.args import DTYPES, PICTURE_SUFFIXES, PLOT_SUFFIXES, Parser  # noqa: F401
