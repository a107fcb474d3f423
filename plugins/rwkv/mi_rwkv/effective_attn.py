"""Effective attention: the [seq_q, seq_src] matrix A with ``A @ v == WKV output``.

Computed only when ``blocks.{i}.rwkv.hook_effective_attn`` is requested, by the shared
recurrence layer (:mod:`mi_core.recurrence`). A covers the tokens of the current call (the
contribution of a carried-in state is not a token column), is signed and unnormalised, and
includes state knockout / steering (they scale columns).

RWKV-6: ``A[t, s] = sum_i r_{t,i} k_{s,i} prod_{j=s+1}^{t-1} w_{j,i}`` for s < t and the bonus
``sum_i r_{t,i} u_i k_{t,i}`` on the diagonal; ``A @ v`` is the WKV output before GroupNorm.

RWKV-7: with transitions ``G_t = diag(w_t) + b_t a_t^T`` (key-value layout),
``A[t, s] = r_t^T G_t G_{t-1} ... G_{s+1} k_s`` (s <= t), obtained by the backward linear
functional ``q <- G_s^T q = w_s * q + a_s (b_s . q)``; ``A @ v`` is the WKV output before
GroupNorm; the ``r_k`` bonus term is added after GroupNorm and is not part of A.
"""

from __future__ import annotations

import torch

from mi_core.recurrence import diagonal_effective_attention, rank1_effective_attention


def effective_attention_v6(r: torch.Tensor, k: torch.Tensor, k_write: torch.Tensor,
                           logw: torch.Tensor, u: torch.Tensor, block: int = 32) -> torch.Tensor:
    """r, k, k_write, logw [B, T, H, K]; u [H, K] -> A [B, H, T, T] (F32)."""
    return diagonal_effective_attention(r, k_write, logw, inclusive=False, bonus=u, k=k,
                                        block=block)


def effective_attention_v7(r: torch.Tensor, k_write: torch.Tensor, logw: torch.Tensor,
                           a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """r, k_write, logw, a, b [B, T, H, K] -> A [B, H, T, T] (F32), by the backward functional."""
    return rank1_effective_attention(r, k_write, logw, a, b)
