"""The command-line SDK: what a plugin needs to add a ``mi`` subcommand.

Register a module in the ``mi_cli`` entry-point group (``[project.entry-points.mi_cli]``)
that implements ``mi_register_commands``; keep torch and ``mi_core`` imports inside the
command's function, so ``mi --help`` stays instant::

    from mi_cli.plugin import command_impl, load, model_options, console

    @command_impl
    def mi_register_commands(subparsers):
        p = subparsers.add_parser("toy", help="...")
        model_options(p)                      # --model, --device, --dtype, --prompt, ...
        p.set_defaults(func=run)

    def run(args):
        model = load(args)                    # the embedded default model unless --model
        ...
        console.say("result")                 # silenced by -q
        return 0

Argument types (:mod:`mi_cli.args`) check every value while parsing, so a bad one is a usage
error (exit 2) before any model loads. See docs/PLUGINS.md.
"""

from mi_cli.args import (
    DTYPES, Parser, device, dtype, edge, float_list, int_list, model_source, nonneg_int,
    output_options, picture_path, plot_path, positive_int, text,
)
from mi_cli.hookspecs import command_impl
from mi_cli.models import (
    DEFAULT_PROMPT, default_model_path, load, load_model, model_name, model_options,
)
from mi_cli.output import CommandError, console, html_of, num, write_json, write_plot

__all__ = [
    "CommandError", "DEFAULT_PROMPT", "DTYPES", "Parser", "command_impl", "console",
    "default_model_path", "device", "dtype", "edge", "float_list", "html_of", "int_list", "load",
    "load_model", "model_name", "model_options", "model_source", "nonneg_int", "num",
    "output_options", "picture_path", "plot_path", "positive_int", "text", "write_json",
    "write_plot",
]
