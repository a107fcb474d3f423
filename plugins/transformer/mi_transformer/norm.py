"""Normalisation layers with TransformerLens-style hooks.

When ``<ln>.hook_scale`` is hooked, a norm computes its divisor ``scale`` (RMS, or std for
LayerNorm, eps included), passes it through ``run.apply`` and, if an intervention is registered
there, divides by the value that comes back: a ``Replace`` with a detached scale freezes the
norm (linearises it), as attribution needs. Otherwise it uses transformers' exact arithmetic.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

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
        """(x, centred for LayerNorm; scale = sqrt(mean(x^2) + eps) [..., 1]), float32 for
        half-precision inputs."""
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        if self.kind is NormType.LAYER_NORM:
            x = x - x.mean(dim=-1, keepdim=True)
        return x, (x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt()

    def __call__(self, x: torch.Tensor, run: HookRun | None = None, scale_name: str = "",
                 normalized_name: str = "", scale: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., d] -> normalised [..., d]. `scale` [..., 1] given: divide by it instead.

        Unless the divisor is replaced (by `scale` or an intervention at `scale_name`), the
        arithmetic is transformers' own (``F.layer_norm``; x * rsqrt(mean(x^2) + eps) in
        float32), so capturing the scale does not change any number.
        """
        if scale is None and run is not None and scale_name and run.wants(scale_name):
            out = run.apply(scale_name, self.divisor(x)[1])
            if run.spec.has_intervention_at(scale_name):
                scale = out
        dtype = x.dtype
        if scale is not None:
            xc, _ = self.divisor(x)
            y = (xc / scale.to(xc.dtype)).to(dtype) * self.gain
            if self.bias is not None:
                y = y + self.bias
        elif self.kind is NormType.LAYER_NORM:
            y = F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        else:
            xf = x.float() if dtype in (torch.float16, torch.bfloat16) else x
            y = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(dtype)
            y = y * self.gain
        if run is not None and normalized_name:
            y = run.apply(normalized_name, y)
        return y
