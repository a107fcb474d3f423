"""Moved to :mod:`mi_cli.main`; kept as an alias (``python -m mi_core.cli.main`` still runs ``mi``)."""

import sys

from mi_cli.main import build_parser, main, plugin_manager  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
