"""JSON for results and configs through one cattrs converter (tensors become nested lists)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import cattrs
import torch

T = TypeVar("T")

converter = cattrs.Converter()
converter.register_unstructure_hook(torch.Tensor, lambda t: t.detach().cpu().tolist())
converter.register_structure_hook(torch.Tensor, lambda v, _: torch.tensor(v))
converter.register_unstructure_hook(Path, str)
converter.register_structure_hook(Path, lambda v, _: Path(v))
converter.register_unstructure_hook(torch.dtype, lambda d: str(d).removeprefix("torch."))
converter.register_structure_hook(torch.dtype, lambda v, _: getattr(torch, v))


def to_dict(obj: Any) -> Any:
    return converter.unstructure(obj)


def to_json(obj: Any, path: str | Path | None = None, indent: int | None = 2,
            raw: bool = True) -> str:
    """Serialise an attrs result; also write it to `path` when given.

    ``raw=False`` leaves out the large raw tensors a result class names in its ``RAW_FIELDS``
    (e.g. the [vocab] logits of an ``AblationResult``: written as null, the summary metrics
    stay); such a result reads back with those fields None.
    """
    data = converter.unstructure(obj)
    if not raw and isinstance(data, dict):
        for name in getattr(type(obj), "RAW_FIELDS", ()):
            data[name] = None
    text = json.dumps(data, indent=indent)
    if path is not None:
        Path(path).write_text(text + "\n", encoding="utf-8")
    return text


def from_json(text_or_path: str | Path, cls: type[T]) -> T:
    """Inverse of :func:`to_json` for attrs class `cls` (a path or a JSON string)."""
    if isinstance(text_or_path, Path) or (isinstance(text_or_path, str)
                                          and not text_or_path.lstrip().startswith(("{", "["))):
        text_or_path = Path(text_or_path).read_text(encoding="utf-8")
    return converter.structure(json.loads(text_or_path), cls)
