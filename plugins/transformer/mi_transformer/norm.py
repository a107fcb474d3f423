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

from mi_core.plugin import HookRun

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
    #: an RMS norm of a half-precision input multiplies its float32 normalised value by the
    #: gain in float32 and rounds once (TransformerConfig.norm_gain_float32: Gemma-3n,
    #: Gemma-4), not round, then multiply in the model's dtype; no-op in float32
    gain_float32: bool = False

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
                 normalized_name: str = "", scale: torch.Tensor | None = None,
                 out_name: str = "") -> torch.Tensor:
        """x [..., d] -> normalised [..., d]. `scale` [..., 1] given: divide by it instead.

        Hooks, as TransformerLens: `scale_name` the divisor [..., 1], `normalized_name`
        ``x / scale`` (centred for LayerNorm) *before* the gain and bias; `out_name` the output
        after them (the sublayer's input, ``attn.hook_in`` / ``mlp.hook_in``).
        Unless the divisor or the normalised value is intervened on, the arithmetic is
        transformers' own (``F.layer_norm``; x * rsqrt(mean(x^2) + eps) in float32), so
        capturing any of these points does not change any number.
        """
        if scale is None and run is not None and scale_name and run.wants(scale_name):
            out = run.apply(scale_name, self.divisor(x)[1])
            if run.spec.has_intervention_at(scale_name):
                scale = out
        dtype = x.dtype
        want_norm = run is not None and normalized_name and run.wants(normalized_name)
        if scale is not None or (want_norm and run.spec.has_intervention_at(normalized_name)):
            # The normalised value feeds the output: divide, hook, then gain and bias.
            if scale is not None:
                xc, _ = self.divisor(x)
                n = (xc / scale.to(xc.dtype)).to(dtype)
            else:
                n = self._normalized(x)
            if want_norm:
                n = run.apply(normalized_name, n)  # type: ignore[union-attr]
            y = (n * self.gain).to(dtype)  # (a float32 gain, norm_weights_float32: x's dtype)
            if self.bias is not None:
                y = y + self.bias
        elif self.kind is NormType.LAYER_NORM:
            if want_norm:  # capture only: the output keeps transformers' fused arithmetic
                run.apply(normalized_name, self._normalized(x))  # type: ignore[union-attr]
            if self.gain_float32 and self.weight.dim() == 1 and x.dtype in (
                    torch.float16, torch.bfloat16):  # OLMo: in float32, rounded once
                y = F.layer_norm(x.float(), self.weight.shape, self.weight.float(),
                                 None if self.bias is None else self.bias.float(),
                                 self.eps).to(dtype)
            elif self.weight.dim() == 1:
                y = F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
            else:  # gains per head [heads, d], normalising over d only (Cohere's q/k norms)
                y = F.layer_norm(x, x.shape[-1:], None, None, self.eps) * self.gain
                if self.bias is not None:
                    y = y + self.bias
        elif (self.kind is NormType.GEMMA_RMS or self.gain_float32) and x.dtype in (
                torch.float16, torch.bfloat16):
            # transformers' Gemma norms multiply by (1 + w) (Gemma-3n / Gemma-4: by w) in
            # float32, then round once
            nf = self._normalized(x, keep_float32=True)
            if want_norm:  # capture only (an intervention there takes the first branch)
                run.apply(normalized_name, nf.to(dtype))  # type: ignore[union-attr]
            wf = self.weight.float()
            y = (nf * (1.0 + wf if self.kind is NormType.GEMMA_RMS else wf)).to(dtype)
        else:
            n = self._normalized(x)
            if want_norm:
                n = run.apply(normalized_name, n)  # type: ignore[union-attr]
            y = n * self.gain
        if run is not None and out_name:
            y = run.apply(out_name, y)
        return y

    def _normalized(self, x: torch.Tensor, keep_float32: bool = False) -> torch.Tensor:
        """x / scale before the gain (centred for LayerNorm), in x's dtype (RMS norms of a
        half-precision x: in float32 with `keep_float32`)."""
        if self.kind is NormType.LAYER_NORM:
            return F.layer_norm(x, x.shape[-1:], None, None, self.eps)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        n = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return n if keep_float32 else n.to(x.dtype)
