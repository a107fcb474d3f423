"""Sparse dictionaries (SAEs, transcoders, CLTs): the shared protocol and `load_dictionary`.

Formats register through the ``mi_register_dictionary_formats`` plugin hook; the core
only detects and dispatches.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, Sequence, runtime_checkable

import attrs
import torch

from mi_core import plugins
from mi_core.errors import DictionaryError
from mi_core.hooks import HookSpec
from mi_core.loading import resolve_source
from mi_core.points import HookPoint


@attrs.define
class SparseActivations:
    """Sparse feature activations: for each position, the active (or top-k) features.

    indices, values: [..., k] (k = number kept per position); d_sae: dictionary width.
    """

    indices: torch.Tensor
    values: torch.Tensor
    d_sae: int

    def to_dense(self) -> torch.Tensor:
        """[..., d_sae] dense tensor (materialises; avoid for large d_sae)."""
        out = torch.zeros(*self.indices.shape[:-1], self.d_sae, dtype=self.values.dtype,
                          device=self.values.device)
        return out.scatter_(-1, self.indices, self.values)

    def __len__(self) -> int:
        return int(self.indices.shape[-1])

    def to_html(self, path: str | os.PathLike[str], tokens: Sequence[str], **kw: Any) -> Any:
        """An interactive page highlighting each feature over `tokens` (indices / values
        [seq, k]); the ``sparse_activations`` view (mi-core's views:
        :func:`mi_core.viz.feature_activations_html` lists `kw`)."""
        return plugins.view("sparse_activations")(self, tokens, path, **kw)


@attrs.frozen
class CltFeatureId:
    """A cross-layer transcoder feature: source layer and index within that layer."""

    layer: int
    index: int


@runtime_checkable
class SparseDictionary(Protocol):
    """An SAE or (single-layer) transcoder."""

    format: str
    architecture: str
    d_in: int
    d_sae: int
    hook_point: HookPoint

    def encode(self, x: torch.Tensor) -> torch.Tensor: ...

    def decode(self, f: torch.Tensor) -> torch.Tensor: ...

    def encode_sparse(self, x: torch.Tensor, k: int | None = None) -> SparseActivations: ...

    def splice(self, hooks: HookSpec, include_error: bool = False) -> HookSpec: ...


def load_dictionary(source: str | os.PathLike[str], device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32, format: str | None = None) -> Any:
    """Load an SAE / transcoder / CLT from a directory, file or hub id; format auto-detected.

    Raises DictionaryError listing what each installed format looked for when none matches.
    """
    formats = plugins.dictionary_formats()
    if not formats:
        raise DictionaryError(f"{source}: no dictionary format plugins are installed "
                              f"(pip install 'mi-core[sae]' or 'mi-core[clt]')")
    patterns = sorted({p for f in formats for p in f.hub_patterns}) or None
    try:
        path = resolve_source(source, patterns)
    except Exception as exc:
        raise DictionaryError(f"{source}: {exc}") from exc
    if format is not None:
        chosen = [f for f in formats if f.name == format]
        if not chosen:
            raise DictionaryError(f"unknown dictionary format {format!r}; installed: "
                                  f"{', '.join(f.name for f in formats)}")
        return chosen[0].load(path, torch.device(device), dtype)
    answers = [(f, f.detect(path)) for f in formats]
    ok = [(f, d) for f, d in answers if d.ok]
    if not ok:
        lines = [f"  {f.name}: {d.reason} (looks for {f.looks_for})" for f, d in answers]
        raise DictionaryError(f"{path}: no dictionary format matches:\n" + "\n".join(lines))
    fmt, _ = max(ok, key=lambda fd: fd[1].score)
    return fmt.load(path, torch.device(device), dtype)
