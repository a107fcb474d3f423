"""``mi``: ordinary CLI conventions — ``--help``, errors on stderr, non-zero exit codes,
no tracebacks for user errors (set MI_CORE_DEBUG=1 to see them)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Sequence

from mi_core import __version__, plugins
from mi_core.errors import MIError


def _cmd_plugins(args: argparse.Namespace) -> int:
    infos = plugins.plugin_infos()
    if not infos:
        print("no mi-core plugins installed (pip install 'mi-core[all]')")
        return 0
    for info in infos:
        print(f"{info.name}  ({info.distribution} {info.version})")
        if info.error:
            print(f"    FAILED TO LOAD: {info.error}")
        for p in info.provides:
            print(f"    {p}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from mi_core.backend import check_compatibility

    report = check_compatibility(args.source)
    print(report.summary())
    return 0 if report.supported else 1


def build_parser() -> argparse.ArgumentParser:
    from mi_core.cli.args import Parser, output_options

    parser = Parser(prog="mi", description="mi-core: mechanistic interpretability of language "
                    "models", epilog="MI_CORE_DEBUG=1 shows Python tracebacks of errors.")
    parser.add_argument("--version", action="version", version=f"mi-core {__version__}",
                        help="print the version and exit")
    output_options(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("plugins", help="list installed plugins, versions and what each provides")
    output_options(p)
    p.set_defaults(func=_cmd_plugins)
    p = sub.add_parser("check", help="say which backend can load a checkpoint (no weights read)")
    p.add_argument("source", help="hub id, directory or file")
    output_options(p)
    p.set_defaults(func=_cmd_check)
    __import__("mi_core.cli.analysis", fromlist=["register"]).register(sub)
    __import__("mi_core.cli.scale", fromlist=["register"]).register(sub)
    plugins.get_plugin_manager().hook.mi_register_commands(subparsers=sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    debug = bool(os.environ.get("MI_CORE_DEBUG"))
    warnings.simplefilter("default")
    warnings.formatwarning = lambda msg, cat, *a, **k: f"mi: warning: {msg}\n"
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 2
        from mi_core.cli.analysis import console

        console.configure(args)
        return int(args.func(args) or 0)
    except MIError as exc:
        if debug:
            raise
        print(f"mi: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mi: interrupted", file=sys.stderr)
        return 130
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        if debug:
            raise
        print(f"mi: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - the CLI never shows a traceback by default
        if debug:
            raise
        print(f"mi: error: {type(exc).__name__}: {exc} (MI_CORE_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
