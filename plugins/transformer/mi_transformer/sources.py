"""Where the weight loader reads tensors from: the :class:`TensorSource` protocol (a
safetensors checkpoint, a dequantizing or regrouping wrapper, a GGUF file's dict) and
:class:`DictSource` over an in-memory dict."""

from __future__ import annotations

from typing import Mapping, Protocol

import torch

from mi_core.plugin import WeightLoadError, checked_tensor


class TensorSource(Protocol):
    shapes: Mapping[str, tuple[int, ...]]

    def names(self) -> list[str]: ...

    def get(self, name: str, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None,
            shape: tuple[int, ...] | None = None) -> torch.Tensor: ...


class DictSource:
    """A TensorSource over an in-memory ``{name: tensor}`` dict (e.g. from GGUF)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], origin: str = "<memory>") -> None:
        self.tensors = tensors
        self.origin = origin
        self.shapes = {k: tuple(v.shape) for k, v in tensors.items()}

    def names(self) -> list[str]:
        return list(self.tensors)

    def get(self, name: str, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None,
            shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if name not in self.tensors:
            raise WeightLoadError(f"{self.origin}: tensor {name!r} not found")
        t = self.tensors[name]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise WeightLoadError(f"{self.origin}: tensor {name!r} has shape {list(t.shape)}, "
                                  f"expected {list(shape)}")
        return checked_tensor(t, name, self.origin, dtype, device)
