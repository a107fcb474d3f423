"""Moved to :mod:`mi_cli`, the command line's own package (it starts without importing torch);
``mi_core.cli.main`` / ``args`` / ``analysis`` / ``scale`` remain as aliases."""
