"""``mi plugins`` and ``mi check``: what is installed, and which backend loads a checkpoint."""

from __future__ import annotations

import argparse
from typing import Any

from mi_cli.args import output_options
from mi_cli.hookspecs import command_impl


def _cmd_plugins(args: argparse.Namespace) -> int:
    from mi_core.plugin import plugin_infos

    infos = plugin_infos()
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
    from mi_core import check_compatibility

    report = check_compatibility(args.source)
    print(report.summary())
    return 0 if report.supported else 1


@command_impl
def mi_register_commands(subparsers: "argparse._SubParsersAction[Any]") -> None:
    p = subparsers.add_parser("plugins",
                              help="list installed plugins, versions and what each provides")
    output_options(p)
    p.set_defaults(func=_cmd_plugins)
    p = subparsers.add_parser("check", help="say which backend can load a checkpoint (no "
                              "weights read)")
    p.add_argument("source", help="hub id, directory or file")
    output_options(p)
    p.set_defaults(func=_cmd_check)
