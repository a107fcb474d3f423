"""The backend protocol: what every backend implements (see docs/PLUGINS.md).

Anything more is a capability the backend declares by implementing a protocol of
:mod:`mi_core.capabilities`; the core checks those before compute.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from mi_core.hooks import HookCache, HookSpec
from mi_core.points import HookPoint
from mi_core.tokenizer import MITokenizer


@runtime_checkable
class MIBackend(Protocol):
    """What every backend implements.

    Attributes: ``name``, ``config`` (attrs), ``num_layers``, ``num_heads``,
    ``num_kv_heads``, ``hidden_size``, ``vocab_size``, ``device``, ``dtype``,
    ``tokenizer`` (MITokenizer or None).
    Anything more is a capability the backend declares by implementing a protocol of
    :mod:`mi_core.capabilities` (hook shapes, KV-cached generation, layer schedules, state
    interventions, weight access, readout, gradients); the core checks them before compute.
    """

    name: str
    config: Any
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    tokenizer: MITokenizer | None

    def hook_points(self) -> list[HookPoint]:
        """Every hook point this model provides, in execution order."""

    def forward(self, ids: torch.Tensor, hooks: HookSpec,
                attention_mask: torch.Tensor | None = None, **kwargs: Any) -> HookCache:
        """ids [batch, seq] -> HookCache(output=logits [batch, seq, vocab], captures)."""

    def project_to_vocab(self, hidden: torch.Tensor) -> torch.Tensor:
        """Residual-stream vectors [..., d_model] -> logits [..., vocab] (final norm + head)."""


#: The members :meth:`mi_core.MIModel.from_pretrained` checks on what a backend's loader returns.
MEMBERS = ("name", "num_layers", "num_heads", "num_kv_heads", "hidden_size", "vocab_size",
           "device", "dtype", "tokenizer", "hook_points", "forward", "project_to_vocab")
