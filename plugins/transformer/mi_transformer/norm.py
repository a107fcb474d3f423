"""Normalisation layers with TransformerLens-style hooks.

Every norm computes its divisor ``scale`` (RMS, or std for LayerNorm, eps included), passes it
through ``run.apply(<ln>.hook_scale, scale)`` and divides by the value that comes back, so a
``Replace`` with a detached scale freezes the norm (linearises it), as attribution needs.
"""

from __future__ import annotations

import attrs
import torch

from mi_core.hooks import HookRun

from mi_transformer.config import NormType


@attrs.define(eq=False)
class Norm:
    """One norm's parameters. `gain` is what multiplies the normalised input
    (``1 + weight`` for Gemma's RMS norm, ``weight`` otherwise); `weight` is as stored."""

    kind: NormType
    eps: float
    weight: torch.Tensor  # [d]
    bias: torch.Tensor | None = None  # [d], LayerNorm only
    gain: torch.Tensor = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        if self.gain is None:
            # Gemma computes (1 + w) in float32; precomputing it once is the same number.
            self.gain = (1.0 + self.weight.float()).to(self.weight.dtype) \
                if self.kind is NormType.GEMMA_RMS else self.weight

    def divisor(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(centred x, scale [..., 1]) in float32 for low-precision inputs."""
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        if self.kind is NormType.LAYER_NORM:
            x = x - x.mean(dim=-1, keepdim=True)
        return x, (x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt()

    def __call__(self, x: torch.Tensor, run: HookRun | None = None, scale_name: str = "",
                 normalized_name: str = "", scale: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., d] -> normalised [..., d]. `scale` given: use it instead of computing one."""
        dtype = x.dtype
        xc, computed = self.divisor(x)
        if scale is None:
            scale = computed
        if run is not None and scale_name:
            scale = run.apply(scale_name, scale)
        y = (xc / scale.to(xc.dtype)).to(dtype) * self.gain
        if self.bias is not None:
            y = y + self.bias
        if run is not None and normalized_name:
            y = run.apply(normalized_name, y)
        return y
