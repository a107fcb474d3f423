"""TransformerLens' ``from_pretrained(..., first_n_layers=n)``: only the first `n` blocks.

TransformerLens sets ``cfg.n_layers = n`` and converts the first `n` blocks' weights (the
embedding, the final norm and the unembedding kept), so the model is the checkpoint's first
`n` blocks followed directly by its final norm and unembedding. mi-core's backends load
checkpoints, so :func:`checkpoint_dir` writes that truncated checkpoint in a temporary
directory (the config with its layer count and per-layer lists cut to `n`, the tensors of
blocks ``>= n`` left out, every other file copied), removed with the model that loads it
(:func:`mi_core.tl.hf_objects.remove_with`), as for ``hf_model=`` objects.

Checkpoint directories (or hub ids) of safetensors files only; a single-file format (a
``.gguf``) is refused with a :class:`mi_core.CapabilityError`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from mi_core import CapabilityError, InputError

#: config keys that hold the number of blocks (HF's names across families)
_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
#: a tensor of block N: ``model.layers.N.``, ``transformer.h.N.``, ``backbone.blocks.N.``, ...
_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def _truncate_config(cfg: dict[str, Any], n: int, where: str) -> bool:
    """Cut `cfg` (a config dict, or its ``text_config``) to `n` blocks in place: the layer
    count, and every list with one entry per block (``layer_types``, ...). Whether it held a
    layer count."""
    key = next((k for k in _COUNT_KEYS if isinstance(cfg.get(k), int)), None)
    if key is None:
        return False
    total = int(cfg[key])
    if not 1 <= n <= total:
        raise InputError(f"first_n_layers={n}: {where} has {total} layers (need 1..{total})")
    for k, v in list(cfg.items()):
        if isinstance(v, list) and len(v) == total and k not in ("architectures",):
            cfg[k] = v[:n]
    cfg[key] = n
    return True


def _keep(name: str, n: int) -> bool:
    m = _BLOCK.search(name)
    return m is None or int(m.group(1)) < n


def _write_tensors(src: Path, out: Path, n: int) -> None:
    """The checkpoint's safetensors files, without the tensors of blocks ``>= n``: one file
    per shard (the index rewritten to name what is left)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise CapabilityError(f"first_n_layers: {src} holds no safetensors files (mi-core "
                              f"reads safetensors checkpoints)")
    index: dict[str, str] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as r:
            meta = r.metadata() or {"format": "pt"}
            tensors = {k: r.get_tensor(k) for k in r.keys() if _keep(k, n)}
        if tensors or len(files) == 1:
            save_file(tensors, str(out / f.name), metadata=meta)
            index.update((k, f.name) for k in tensors)
    for idx in src.glob("*.safetensors.index.json"):
        data = json.loads(idx.read_text())
        data["weight_map"] = {k: v for k, v in data.get("weight_map", {}).items() if k in index}
        (out / idx.name).write_text(json.dumps(data, indent=1))


def checkpoint_dir(source: str, n: int, revision: Optional[str] = None) -> Path:
    """A temporary checkpoint directory holding `source`'s first `n` blocks (see the module
    doc); `source` a checkpoint directory or a hub id."""
    from mi_core.plugin import DEFAULT_HUB_PATTERNS, refuse_pickle, resolve_source

    if isinstance(n, bool) or not isinstance(n, int):
        raise InputError(f"first_n_layers must be an int, got {type(n).__name__}")
    src = resolve_source(source, [*DEFAULT_HUB_PATTERNS, "*.jinja"], revision=revision)
    refuse_pickle(src)
    if not src.is_dir() or not (src / "config.json").exists():
        raise CapabilityError(
            f"first_n_layers: {source} is not a checkpoint directory with a config.json (a "
            f"single-file format such as .gguf cannot be cut here); load a checkpoint directory")
    cfg = json.loads((src / "config.json").read_text())
    found = _truncate_config(cfg, n, str(source))
    sub = cfg.get("text_config")
    if isinstance(sub, dict):
        found = _truncate_config(sub, n, f"{source} (text_config)") or found
    if not found:
        raise CapabilityError(f"first_n_layers: {source}'s config.json names no layer count "
                              f"({' / '.join(_COUNT_KEYS)})")
    out = Path(tempfile.mkdtemp(prefix="mi-tl-first-layers-"))
    try:
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
        _write_tensors(src, out, n)
        for f in src.iterdir():  # tokenizer, generation config, chat templates, ...
            if f.is_file() and f.name != "config.json" and not f.name.endswith(
                    (".safetensors", ".safetensors.index.json", ".bin", ".pt", ".pth")):
                shutil.copy(f, out / f.name)
            elif f.is_dir() and not f.name.startswith("."):
                shutil.copytree(f, out / f.name)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out


def source(model_name: Any, hf_model: Any, tokenizer: Any, first_n_layers: Optional[int],
           revision: Optional[str]) -> tuple[str, Optional[str], Any, bool]:
    """What ``from_pretrained`` loads: (source, revision, tokenizer, whether the source is a
    temporary directory to remove with the model). `hf_model` (a transformers object) is
    written as a checkpoint (:mod:`mi_core.tl.hf_objects`, its tokenizer beside it), then cut to
    `first_n_layers` blocks when given."""
    from mi_core.tl import hf_objects

    src, temporary = os.fspath(model_name), False
    if hf_model is not None:  # TransformerLens reads the object's weights: so do we
        src, tokenizer, temporary = os.fspath(hf_objects.checkpoint_dir(hf_model, tokenizer)), \
            None, True
    if first_n_layers is not None:
        try:
            cut = os.fspath(checkpoint_dir(src, first_n_layers, revision))
        finally:
            if temporary:
                shutil.rmtree(src, ignore_errors=True)
        src, revision, temporary = cut, None, True
    return src, revision, tokenizer, temporary


__all__ = ["checkpoint_dir", "source"]
