"""Moved to :mod:`mi_core.tl.patching` (TransformerLens' patching functions belong to the
TransformerLens layer); kept as an alias."""

from mi_core.tl.patching import *  # noqa: F401,F403
