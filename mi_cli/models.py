"""The options every model command shares (``--model``, ``--device``, ``--dtype``,
``--prompt``, ``--json``, ``--raw``, ``--plot``, ``-q/--verbose``) and loading the model."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from mi_cli import args as A
from mi_cli.output import console

DEFAULT_PROMPT = "The capital of France is"


def default_model_path() -> str | None:
    """The default model a plugin embeds (``mi_default_model`` hook), or None."""
    from mi_core.plugin import get_plugin_manager

    found = get_plugin_manager().hook.mi_default_model()
    # the hookspec is firstresult (one path or None); accept a list too
    for path in [found] if isinstance(found, (str, Path)) or found is None else found:
        if path:
            return str(path)
    return None


def load_model(model: str | None, device: str = "cpu", dtype: Any = None) -> Any:
    """``MIModel.from_pretrained(model)``; None: the embedded default model a plugin provides."""
    import torch

    from mi_core import MIModel, UnsupportedModelError

    dtype = torch.float32 if dtype is None else getattr(torch, dtype) if isinstance(dtype, str) \
        else dtype
    if model is None:
        model = default_model_path()
        if model is None:
            raise UnsupportedModelError(
                "no default model is available: install a plugin that embeds one (see "
                "`mi plugins` and docs/PLUGINS.md, mi_default_model), or pass --model PATH")
    t0 = time.perf_counter()
    name = Path(str(model)).name or str(model)
    console.step(f"loading {name} on {device} ({str(dtype).removeprefix('torch.')}) ...")
    m = MIModel.from_pretrained(model, device=device, dtype=dtype)
    console.step(f"loaded {name} in {time.perf_counter() - t0:.1f} s")
    console.detail(f"loaded {model}")
    return m


def load(args: argparse.Namespace) -> Any:
    """The model of a command's ``--model`` / ``--device`` / ``--dtype``."""
    return load_model(args.model, args.device, dtype=args.dtype)


def model_name(model: Any) -> str:
    """A short name for titles: the checkpoint's file or folder name."""
    src = str(getattr(model, "source", "") or "model")
    return Path(src).name or src


def model_options(p: argparse.ArgumentParser, prompt: bool = True, html: bool = True) -> None:
    """--model, --device, --dtype, --prompt, --json, --raw, --plot, -q/--verbose (`html`:
    whether --plot accepts .html, i.e. the command has an interactive view)."""
    p.add_argument("--model", default=None, type=A.model_source, metavar="PATH",
                   help="checkpoint: directory, hub id or .gguf file (default: the embedded "
                   "model a plugin provides; see `mi plugins`)")
    p.add_argument("--device", default="cpu", type=A.device,
                   help="torch device: cpu (default), cuda, cuda:N, mps")
    p.add_argument("--dtype", default="float32", type=A.dtype,
                   metavar="{" + ",".join(A.DTYPES) + "}",
                   help="dtype of the weights and activations (default: float32)")
    if prompt:
        p.add_argument("--prompt", default=DEFAULT_PROMPT, type=A.text, metavar="TEXT",
                       help=f"input text (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT",
                   help="write the result as JSON (spec, prompt, summary metrics)")
    p.add_argument("--raw", action="store_true",
                   help="with --json: also write the raw tensors (e.g. the [vocab] logits)")
    if html:
        p.add_argument("--plot", dest="plot_out", default=None, metavar="OUT", type=A.plot_path,
                       help="write a picture (.png, .svg, .pdf) or an interactive page (.html)")
    else:
        p.add_argument("--plot", dest="plot_out", default=None, metavar="OUT",
                       type=A.picture_path, help="write a picture (.png, .svg, .pdf)")
    A.output_options(p)
