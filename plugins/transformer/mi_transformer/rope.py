"""Rotary position embeddings (default, linear, llama3 and dynamic-NTK scaling), as transformers computes them."""

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
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope.scaling is RopeScaling.LINEAR:
        return inv / rope.factor
    if rope.scaling is RopeScaling.LLAMA3:
        low_wavelen = rope.original_max_positions / rope.low_freq_factor
        high_wavelen = rope.original_max_positions / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv


def cos_sin(inv: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [batch, seq] -> (cos, sin) [batch, 1, seq, rot_dim], broadcast over heads
    of [batch, heads, seq, d_head] tensors."""
    freqs = positions.to(torch.float32)[..., None] * inv.to(positions.device)  # [b, s, rot/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


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
