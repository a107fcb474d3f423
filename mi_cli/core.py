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
    """Detection (config.json and tensor names, or a file's name) and then, for a source
    that looks supported, the header or config read by the backend's ``mi_checkpoint_info``
    (no weights): a text file named .gguf is NOT supported, with the reason."""
    from mi_cli.preflight import checkpoint_info
    from mi_core import MIError, check_compatibility

    report = check_compatibility(args.source)
    lines = report.summary().split("\n")
    if not report.supported:
        print("\n".join(lines))
        return 1
    try:
        dims = checkpoint_info(args.source)
    except MIError as exc:
        print(f"{args.source}: NOT supported: its header / config could not be read: {exc}")
        print("  detection from the name / config alone (overruled by the header):")
        print("\n".join("  " + line for line in lines[1:]))
        return 1
    print("\n".join(lines))
    if dims is not None:
        print(f"  read without weights: {dims.num_layers} layers, {dims.num_heads} heads"
              + (", tokenizer found" if dims.tokenizer is not None else ", no tokenizer"))
    return 0


@command_impl
def mi_register_commands(subparsers: "argparse._SubParsersAction[Any]") -> None:
    p = subparsers.add_parser("plugins",
                              help="list installed plugins, versions and what each provides")
    output_options(p)
    p.set_defaults(func=_cmd_plugins)
    p = subparsers.add_parser("check", help="say which backend can load a checkpoint (reads "
                              "its config or file header, no weights)")
    p.add_argument("source", help="hub id, directory or file")
    output_options(p)
    p.set_defaults(func=_cmd_check)
