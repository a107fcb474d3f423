"""``mi``: ordinary CLI conventions — ``--help``, errors on stderr, non-zero exit codes,
no tracebacks for user errors (set MI_CORE_DEBUG=1 to see them).

The parser is built from the commands the ``mi_cli`` entry points register (mi-core's own
included) without importing torch; a command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import sys
import warnings
from typing import Sequence

import pluggy

from mi_cli import hookspecs
from mi_cli.args import Parser, output_options

ENTRY_POINT_GROUP = "mi_cli"
_pm: pluggy.PluginManager | None = None


def plugin_manager() -> pluggy.PluginManager:
    """The command plugins (entry-point group ``mi_cli``), loaded once; a broken one is
    skipped with a warning, as mi-core's plugins are."""
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager("mi_cli")
        pm.add_hookspecs(hookspecs)
        for ep in md.entry_points(group=ENTRY_POINT_GROUP):
            if pm.has_plugin(ep.name):
                continue
            try:
                pm.register(ep.load(), name=ep.name)
            except Exception as exc:  # a broken plugin must not take the CLI down
                warnings.warn(f"mi command plugin {ep.name!r} ({ep.value}) failed to load and "
                              f"is skipped: {type(exc).__name__}: {exc}", stacklevel=2)
        _pm = pm
    return _pm


def _version() -> str:
    try:
        return md.version("mi-core")
    except md.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def build_parser(legacy: bool = False) -> argparse.ArgumentParser:
    """The ``mi`` parser with every command the ``mi_cli`` plugins register; with `legacy`,
    also those registered on mi-core's own surface (deprecated; that loads the kernel)."""
    parser = Parser(prog="mi", description="mi-core: mechanistic interpretability of language "
                    "models", epilog="MI_CORE_DEBUG=1 shows Python tracebacks of errors.")
    parser.add_argument("--version", action="version", version=f"mi-core {_version()}",
                        help="print the version and exit")
    output_options(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    plugin_manager().hook.mi_register_commands(subparsers=sub)
    if legacy:
        from mi_core.plugin import get_plugin_manager

        get_plugin_manager().hook.mi_register_commands(subparsers=sub)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The command word of `argv` (the first argument that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def _parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The fast parser, or the legacy one when `argv` names a command the fast one lacks.

    A word close to a known command is a typo, answered at once with the suggestion
    (without loading the kernel to look for a deprecated command of that name)."""
    import difflib

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = _command(argv)
    if command is not None and command not in sub.choices:
        if difflib.get_close_matches(command, list(sub.choices), n=1, cutoff=0.6):
            return parser
        return build_parser(legacy=True)
    return parser


def _is_user_error(exc: BaseException) -> bool:
    """mi-core's own errors (without importing mi_core: none can exist unless it was loaded),
    a command's refusal, and file-system errors are the user's to fix: no traceback."""
    from mi_cli.output import CommandError

    errors = sys.modules.get("mi_core.errors")
    return isinstance(exc, (CommandError, FileNotFoundError, PermissionError,
                            IsADirectoryError)) or (
        errors is not None and isinstance(exc, errors.MIError))


def main(argv: Sequence[str] | None = None) -> int:
    debug = bool(os.environ.get("MI_CORE_DEBUG"))
    warnings.simplefilter("default")
    warnings.formatwarning = lambda msg, cat, *a, **k: f"mi: warning: {msg}\n"
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = _parser_for(argv)
        parser.mi_argv = argv  # type: ignore[attr-defined]  # for the option hint of error()
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 2
        return _run(args)
    except KeyboardInterrupt:
        print("mi: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI never shows a traceback by default
        if debug:
            raise
        if _is_user_error(exc):
            print(f"mi: error: {exc}", file=sys.stderr)
            return int(getattr(exc, "exit_code", 1))
        else:
            print(f"mi: error: {type(exc).__name__}: {exc} (MI_CORE_DEBUG=1 shows the "
                  f"traceback)", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    """Run the chosen command with progress on stderr unless ``-q`` (restored afterwards)."""
    from mi_cli.output import console
    from mi_core.plugin import set_progress

    console.configure(args)
    before = set_progress(not console.quiet)
    try:
        return int(args.func(args) or 0)
    finally:
        set_progress(before)


if __name__ == "__main__":
    sys.exit(main())
