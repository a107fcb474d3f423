"""Effective attention: the [seq_q, seq_src] matrix A with ``A @ v == WKV output``.

Computed only when ``blocks.{i}.rwkv.hook_effective_attn`` is requested. A covers the
tokens of the current call (the contribution of a carried-in state is not a token column),
is signed and unnormalised, and includes state knockout / steering (they scale columns).

RWKV-6: ``A[t, s] = sum_i r_{t,i} k_{s,i} prod_{j=s+1}^{t-1} w_{j,i}`` for s < t and the bonus
``sum_i r_{t,i} u_i k_{t,i}`` on the diagonal; ``A @ v`` is the WKV output before GroupNorm.

RWKV-7: with transitions ``G_t = diag(w_t) + b_t a_t^T`` (key-value layout),
``A[t, s] = r_t^T G_t G_{t-1} ... G_{s+1} k_s`` (s <= t), obtained by the backward linear
functional ``q <- G_s^T q = w_s * q + a_s (b_s . q)``; ``A @ v`` is the WKV output before
GroupNorm; the ``r_k`` bonus term is added after GroupNorm and is not part of A.
"""

from __future__ import annotations

import torch


def effective_attention_v6(r: torch.Tensor, k: torch.Tensor, k_write: torch.Tensor,
                           logw: torch.Tensor, u: torch.Tensor, block: int = 32) -> torch.Tensor:
    """r, k, k_write, logw [B, T, H, K]; u [H, K] -> A [B, H, T, T] (F32).

    Pairwise decays are formed as differences of a float64 cumulative log-decay, so long
    sequences do not overflow or lose precision; queries are processed in blocks.
    """
    bsz, t, h, kd = r.shape
    rr, kk = r.permute(0, 2, 1, 3), k_write.permute(0, 2, 1, 3)      # [B, H, T, K]
    cum = logw.double().permute(0, 2, 1, 3).cumsum(2)                # b_t, inclusive
    excl = cum - logw.double().permute(0, 2, 1, 3)                   # b_{t-1}
    out = torch.zeros(bsz, h, t, t, dtype=torch.float32, device=r.device)
    for q0 in range(0, t, block):
        q1 = min(t, q0 + block)
        d = excl[:, :, q0:q1, None, :] - cum[:, :, None, :q1, :]     # [B, H, tq, s, K]
        mask = torch.arange(q0, q1, device=r.device)[:, None] > torch.arange(q1, device=r.device)[None, :]
        d = d.masked_fill(~mask[:, :, None], float("-inf"))
        out[:, :, q0:q1, :q1] = (rr[:, :, q0:q1, None, :] * d.exp().float()
                                 * kk[:, :, None, :q1, :]).sum(-1)
    diag = (r * u * k).sum(-1).permute(0, 2, 1)                      # [B, H, T]
    idx = torch.arange(t, device=r.device)
    out[:, :, idx, idx] = diag
    return out


def effective_attention_v7(r: torch.Tensor, k_write: torch.Tensor, logw: torch.Tensor,
                           a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """r, k_write, logw, a, b [B, T, H, K] -> A [B, H, T, T] (F32), by the backward functional."""
    bsz, t, h, kd = r.shape
    rr, kk, ww, aa, bb = (x.float().permute(0, 2, 1, 3) for x in (r, k_write, logw.exp(), a, b))
    q = torch.zeros(bsz, h, t, kd, dtype=torch.float32, device=r.device)
    out = torch.zeros(bsz, h, t, t, dtype=torch.float32, device=r.device)
    for s in range(t - 1, -1, -1):
        q[:, :, s] = rr[:, :, s]                    # the query at t = s joins (P_{s,s} = I)
        out[:, :, :, s] = (q * kk[:, :, s, None, :]).sum(-1)
        # q_t <- G_s^T q_t for every query t >= s (rows t < s are still zero)
        q = q * ww[:, :, s, None, :] + (q * bb[:, :, s, None, :]).sum(-1, keepdim=True) * aa[:, :, s, None, :]
    return out
