"""The command line's plugin surface (pluggy project ``mi_cli``, entry-point group ``mi_cli``).

Separate from mi-core's own surface so that registering commands imports no torch: a module
named by a ``mi_cli`` entry point must be importable without torch or ``mi_core``.
"""

from __future__ import annotations

import argparse
from typing import Any

import pluggy

#: Marks the specification (this module only).
command_spec = pluggy.HookspecMarker("mi_cli")
#: Marks a plugin's implementation: ``@command_impl def mi_register_commands(subparsers): ...``
command_impl = pluggy.HookimplMarker("mi_cli")


@command_spec
def mi_register_commands(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Add subcommands to ``mi``: ``p = subparsers.add_parser(...)``, then
    ``p.set_defaults(func=callable(args) -> int)``. Import heavy modules inside `func`."""


@command_spec(firstresult=True)
def mi_checkpoint_info(source: str) -> dict[str, Any] | None:
    """What a checkpoint declares, read WITHOUT its weights (its config.json or its file
    header), so ``mi`` checks layer, head and position ranges before the weights load:
    ``{"num_layers": int, "num_heads": int, "num_kv_heads": int, "vocab_size": int,
    "tokenizer": an MITokenizer or None, "what": "GGUF llama, 30 layers"}``. Return None
    when `source` is not yours; raise mi-core's ``WeightLoadError`` / ``ConfigError`` for a
    file that claims to be yours and is not (``mi check`` reports it as not supported).
    Import heavy modules inside the function."""
