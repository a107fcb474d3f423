"""Rotary position embeddings (default, linear, llama3, dynamic-NTK, yarn, longrope and
proportional scaling), as transformers' ``modeling_rope_utils`` computes them."""

from __future__ import annotations

import math

import torch

from mi_transformer.config import RopeConfig, RopeScaling


def inv_freq(rope: RopeConfig, dim: int, seq_len: int | None = None) -> torch.Tensor:
    """Inverse frequencies [dim // 2], float32, with the configured scaling applied.

    `seq_len` (dynamic scaling only): the longest position + 1 of the call; the base grows
    once it exceeds max_position_embeddings. transformers keeps the largest value seen in a
    stateful buffer; we recompute per call, which is the same while sequences only grow
    (one prompt, or generation) and differs only for a short call after a long one.
    """
    theta = rope.theta
    if rope.scaling is RopeScaling.DYNAMIC:
        n = max(seq_len or 0, rope.original_max_positions)
        theta = theta * ((rope.factor * n / rope.original_max_positions)
                         - (rope.factor - 1)) ** (dim / (dim - 2))
    if rope.scaling is RopeScaling.PROPORTIONAL:
        return _proportional(rope, dim)
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope.scaling is RopeScaling.LINEAR:
        return inv / rope.factor
    if rope.scaling is RopeScaling.YARN:
        return _yarn(rope, dim)
    if rope.scaling is RopeScaling.LONGROPE:
        # Phi-3: the long factors once the call reaches past the pretraining length, else short.
        long = seq_len is not None and seq_len > rope.original_max_positions
        ext = torch.tensor(rope.long_factor if long else rope.short_factor, dtype=torch.float32)
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (ext * theta ** shape)
    if rope.scaling is RopeScaling.LLAMA3:
        low_wavelen = rope.original_max_positions / rope.low_freq_factor
        high_wavelen = rope.original_max_positions / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
        if rope.high_freq_factor == rope.low_freq_factor:
            return scaled  # no medium band (Llama 4's published 1.0 / 1.0), a step
        smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv


def _proportional(rope: RopeConfig, dim: int) -> torch.Tensor:
    """Gemma-4's proportional RoPE (transformers' ``_compute_proportional_rope_parameters``):
    the first int(fraction * dim / 2) frequencies with exponents over the whole `dim`, the
    others 0 (cos 1, sin 0: those dims pass unrotated), all divided by `factor`."""
    angles = int(rope.fraction * dim // 2)
    rotated = 1.0 / (rope.theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float()
                                    / dim))
    inv = torch.cat((rotated, torch.zeros(dim // 2 - angles, dtype=torch.float32)))
    return inv / rope.factor


def _yarn(rope: RopeConfig, dim: int) -> torch.Tensor:
    """YaRN: interpolate the low frequencies by `factor`, keep the high ones, with a linear
    ramp between the dimensions where beta_fast and beta_slow rotations fit the original
    context (transformers' ``_compute_yarn_parameters``)."""
    base, factor = rope.theta, rope.factor

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_positions / (rotations * 2 * math.pi))) / (
            2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid a zero-width ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep


def attention_scaling(rope: RopeConfig) -> float:
    """The factor transformers multiplies cos and sin by (so q.k scales by its square):
    the configured ``attention_factor``, else YaRN's 0.1 ln(factor) + 1 (or its mscale ratio)
    and LongRoPE's sqrt(1 + ln(factor) / ln(original length)); 1 for other types."""
    if rope.attention_factor is not None:
        return rope.attention_factor
    f = rope.factor
    if rope.scaling is RopeScaling.YARN:
        def mscale(m: float = 1.0) -> float:
            return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0
        if rope.mscale and rope.mscale_all_dim:
            return float(mscale(rope.mscale) / mscale(rope.mscale_all_dim))
        return mscale()
    if rope.scaling is RopeScaling.LONGROPE:
        return 1.0 if f <= 1.0 else math.sqrt(1 + math.log(f) / math.log(rope.original_max_positions))
    return 1.0


def cos_sin(inv: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, scale: float = 1.0
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [batch, seq] -> (cos, sin) [batch, 1, seq, rot_dim], broadcast over heads
    of [batch, heads, seq, d_head] tensors; both multiplied by `scale` (attention_scaling)."""
    freqs = positions.to(torch.float32)[..., None] * inv.to(positions.device)  # [b, s, rot/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, d_head]; the first cos.shape[-1] dims rotate (partial RoPE)."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat((xr * cos + _rotate_half(xr) * sin, xp), dim=-1)
