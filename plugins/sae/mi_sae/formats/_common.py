"""Helpers shared by the format readers: safe tensor reading, typed config fields, errors.

Never unpickles: weights come from safetensors or pickle-free ``.npz`` only, and a folder
that offers only pickle files (``.pt``, ``.pth``, ``.pkl``, ``.bin``, ``.ckpt``) is refused
by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from mi_core.plugin import (
    ConfigError, ConfigFields, Detection, DictionaryError, HookPoint, MIError, REQUIRED,
    SafetensorsCheckpoint, read_json,
)
from mi_sae.hooknames import tl_to_hook_point


def folder_of(path: Path) -> Path:
    """The directory holding a dictionary given the directory or one of its files."""
    return path if path.is_dir() else path.parent


#: Suffixes of files that are (or usually are) Python pickles: never opened.
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt")


def pickle_files(folder: Path) -> list[str]:
    """Names of pickle-format files directly in `folder` (sorted)."""
    if not folder.is_dir():
        return [folder.name] if folder.suffix in PICKLE_SUFFIXES else []
    return sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)


def detection(name: str, folder: Path, required: list[str], score: float) -> Detection:
    """ok (`score`) when every file in `required` exists under `folder`, else why not
    (naming any pickle files found instead: they are refused, never unpickled)."""
    missing = [r for r in required if not (folder / r).exists()]
    if missing:
        pickles = pickle_files(folder)
        refused = (f"; refusing pickle file(s) {', '.join(pickles)} (never unpickled: convert "
                   "to safetensors)") if pickles else ""
        return Detection(backend=name, score=0.0,
                         reason=f"no {', '.join(missing)} in {folder}{refused}")
    return Detection(backend=name, score=score, reason=f"found {', '.join(required)}")


class Fields(ConfigFields):
    """Typed, strict access to a dictionary's JSON config: no coercion ("false" is not
    True, 2.7 is not 2); every DictionaryError names the file, the key and the value.

    `fallback` is consulted for keys absent (or null) in `raw` (SAELens 6.x ``metadata``).
    """

    def __init__(self, raw: Mapping[str, Any], where: Path | str,
                 fallback: Mapping[str, Any] | None = None) -> None:
        super().__init__(raw, where, error=DictionaryError, fallback=fallback)

    def number(self, key: str, default: Any = REQUIRED, positive: bool = True) -> Any:
        """A finite number (> 0 if `positive`), as a float."""
        return super().number(key, default, gt=0 if positive else None)

    def text(self, key: str, default: Any = None, choices: Iterable[str] | None = None) -> Any:
        return super().text(key, default, choices)

    def mapping(self, key: str, default: Any = None) -> Any:
        """A JSON object; {} when absent or null."""
        return super().mapping(key, {} if default is None else default)

    def hook(self, key: str) -> HookPoint | None:
        """A TransformerLens-spelled hook name (``blocks.3.hook_resid_post``) or None."""
        name = self.text(key)
        if name is None:
            return None
        try:
            return tl_to_hook_point(name)
        except MIError as exc:
            raise self.fail(key, f"not a hook point name ({exc})") from None


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
        raw = {n: ck.get(n) for n in ck.names()}
    except MIError as exc:
        raise DictionaryError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
    return _floats(raw, path, device, dtype)


def _floats(raw: dict[str, torch.Tensor], path: Path, device: torch.device, dtype: torch.dtype
            ) -> dict[str, torch.Tensor]:
    """`raw` cast to `dtype`; DictionaryError naming any non-float (integer, bool) tensor."""
    bad = [f"{n} ({t.dtype})" for n, t in raw.items() if not t.is_floating_point()]
    if bad:
        raise DictionaryError(f"{path}: non-float tensor(s) {', '.join(bad)}: dictionary "
                              "weights must be floating point")
    return {n: t.to(device=device, dtype=dtype) for n, t in raw.items()}


def read_npz(path: Path, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every array of an .npz (never unpickled: allow_pickle=False)."""
    if not path.exists():
        raise DictionaryError(f"weights file {path} not found")
    try:
        with np.load(path, allow_pickle=False) as data:
            raw = {k: torch.from_numpy(np.asarray(data[k])) for k in data.files}
    except (ValueError, OSError, TypeError) as exc:  # TypeError: numpy dtypes torch lacks
        raise DictionaryError(f"{path}: cannot read as a (pickle-free) npz: {exc}") from None
    return _floats(raw, path, device, dtype)


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
