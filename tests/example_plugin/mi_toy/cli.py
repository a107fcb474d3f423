"""``mi resid-norms``: the example plugin's command (the ``mi_cli`` entry-point group).

Nothing heavy at import time: torch and mi_core load when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from mi_cli.plugin import command_impl, console, load, model_options, write_json


@command_impl
def mi_register_commands(subparsers: "argparse._SubParsersAction[Any]") -> None:
    p = subparsers.add_parser("resid-norms", help="norm of the residual stream after each "
                              "layer (the example plugin's analysis)")
    model_options(p, html=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mi_toy.analysis import resid_norms

    norms = resid_norms(load(args), args.prompt)
    for layer, norm in enumerate(norms):
        console.say(f"L{layer}: {norm:.4f}")
    write_json(args.json_out, {"resid_norms": norms})
    return 0
