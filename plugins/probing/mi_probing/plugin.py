"""Registration of mi-probing with mi-core (the same hooks a third-party plugin implements)."""

from __future__ import annotations

import argparse
from typing import Any

from mi_core import plugin_impl


@plugin_impl
def mi_register_commands(subparsers: "argparse._SubParsersAction[Any]") -> None:
    from mi_probing.cli import add_probe_parser

    add_probe_parser(subparsers)


@plugin_impl
def mi_plugin_info() -> dict[str, Any]:
    return {"provides": ["linear probes (mi probe)"]}
