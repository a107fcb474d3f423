"""Helpers shared by the format readers: safe tensor reading and typed errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from mi_core.errors import ConfigError, DictionaryError, MIError
from mi_core.loading import SafetensorsCheckpoint, read_json
from mi_core.registry import Detection


def folder_of(path: Path) -> Path:
    """The directory holding a dictionary given the directory or one of its files."""
    return path if path.is_dir() else path.parent


def detection(name: str, folder: Path, required: list[str], score: float) -> Detection:
    """ok (`score`) when every file in `required` exists under `folder`, else why not."""
    missing = [r for r in required if not (folder / r).exists()]
    if missing:
        return Detection(backend=name, score=0.0, reason=f"no {', '.join(missing)} in {folder}")
    return Detection(backend=name, score=score, reason=f"found {', '.join(required)}")


def json_config(path: Path, what: str) -> dict[str, Any]:
    try:
        return read_json(path, what)
    except ConfigError as exc:
        raise DictionaryError(str(exc)) from None


def read_safetensors(path: Path, device: torch.device, dtype: torch.dtype
                     ) -> dict[str, torch.Tensor]:
    """Every tensor of one safetensors file, cast; errors name the file (and tensor)."""
    if not path.exists():
        raise DictionaryError(f"weights file {path} not found")
    try:
        ck = SafetensorsCheckpoint([path])
        return {n: ck.get(n, dtype=dtype, device=device) for n in ck.names()}
    except MIError as exc:
        raise DictionaryError(f"{path}: {exc}") from None


def read_npz(path: Path, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every array of an .npz (never unpickled: allow_pickle=False)."""
    if not path.exists():
        raise DictionaryError(f"weights file {path} not found")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: torch.from_numpy(np.asarray(data[k])).to(device=device, dtype=dtype)
                    for k in data.files}
    except (ValueError, OSError) as exc:
        raise DictionaryError(f"{path}: cannot read as a (pickle-free) npz: {exc}") from None


def take(weights: dict[str, torch.Tensor], names: tuple[str, ...], source: Path,
         required: bool = True) -> torch.Tensor | None:
    """The first of `names` present in `weights`; DictionaryError naming them if required."""
    for n in names:
        if n in weights:
            return weights[n]
    if required:
        raise DictionaryError(f"{source}: missing tensor {names[0]!r}"
                              + (f" (or {', '.join(map(repr, names[1:]))})" if names[1:] else "")
                              + f"; file has {', '.join(sorted(weights)) or 'no tensors'}")
    return None
