"""Edited copies of a saved checkpoint folder for the transformer bad-input tests, and a
direct load that bypasses the plugin manager (detection is tested separately).

`variant(src, dst, config_edit, tensor_edit)`: copy `src` to `dst`, then let
`config_edit(cfg)` change config.json's dict and `tensor_edit(tensors)` model.safetensors'
name -> tensor dict, in place. `source_of(path)` / `load_direct(path, dtype)`: the
ModelSource the core builds for `path` and our model loaded from it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

import mi_core as mi
from mi_core.loading import read_config, tensor_names_of
from mi_core.registry import ModelSource


def source_of(path: Path) -> ModelSource:
    names, shapes = tensor_names_of(path)
    return ModelSource(path=path, config=read_config(path), tensor_names=names,
                       tensor_shapes=shapes)


def variant(src: Path, dst: Path, config_edit: Callable[[dict], None] | None = None,
            tensor_edit: Callable[[dict], None] | None = None) -> Path:
    shutil.copytree(src, dst)
    if config_edit is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config_edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensor_edit is not None:
        f = dst / "model.safetensors"
        tensors = load_file(f)
        tensor_edit(tensors)
        save_file(tensors, f, metadata={"format": "pt"})
    return dst


def load_direct(path: Path, dtype: torch.dtype = torch.float32) -> mi.MIModel:
    """Our transformer model of `path`, loaded without going through the plugin manager."""
    from mi_transformer.loader import load_backend

    return mi.MIModel(load_backend(source_of(path), torch.device("cpu"), dtype))
