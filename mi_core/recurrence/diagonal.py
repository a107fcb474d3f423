"""Linear recurrences with a diagonal (per key channel, or per head) decay.

In key-value layout (``S[..., i, j]`` couples key channel i with value channel j) the state
after token t is ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T`` (g: log-decay, <= 0), and the
output reads it with a query: ``y_t = S_t^T q_t`` (*inclusive*), or ``y_t = S_{t-1}^T q_t``
plus a bonus ``(q_t . (u * k_t)) v_t`` (*exclusive*). A decay of shape [..., 1] is one scalar
per head (the state-space-dual form), otherwise one per key channel.

Three forms of the same numbers:

- :func:`diagonal_scan`, the forward: chunked. Inside a chunk of L tokens the pairwise decays
  ``exp(G_t - G_s)`` (G: cumulative log-decay, float64, exponents <= 0) make an L x L
  matrix; chunks are chained by one state update each; one token is a plain step. A scalar
  value per head with a decay per key channel (one recurrence per channel, nothing for a
  matmul to gain) runs the exact recurrence instead, vectorised over the channels.
- :func:`diagonal_states`, the exact recurrence token by token, returning every per-step
  state (only for a state hook: [batch, seq, heads, K, V] is materialised only then).
- :func:`diagonal_effective_attention`, the [batch, heads, seq, seq] matrix A with
  ``A @ v == y`` for the tokens of the call (a carried-in state is not a column).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunks(x: torch.Tensor, length: int) -> torch.Tensor:
    """[B, T, H, K] (T a multiple of `length`) -> [B, H, n, L, K]."""
    b, t, h, k = x.shape
    return x.view(b, t // length, length, h, k).permute(0, 3, 1, 2, 4)


def pad_time(xs: list[torch.Tensor], pad: int) -> list[torch.Tensor]:
    """Zero-pad each [B, T, H, K] at the end of the time axis (a zero log-decay is decay 1)."""
    return [F.pad(x, (0, 0, 0, 0, 0, pad)) for x in xs] if pad else xs


def diagonal_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                  state: torch.Tensor, *, inclusive: bool = True,
                  bonus: torch.Tensor | None = None, k_write: torch.Tensor | None = None,
                  chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence over a call, chunked. Returns (y [B, T, H, V], state after the call).

    q, k: [B, T, H, K]; v: [B, T, H, V]; log_decay: [B, T, H, K] or [B, T, H, 1] (<= 0);
    state: [B, H, K, V]; all F32. `k_write`: the key written into the state (k scaled by
    state knockout / steering, zero at padding), default k. `bonus` [H, K] (exclusive only):
    the current token's own term ``(q_t . (bonus * k_t)) v_t`` with the unscaled key.
    """
    kw = k if k_write is None else k_write
    extra = (q * bonus * k).sum(-1, keepdim=True) * v if bonus is not None else None
    if q.shape[1] == 1:  # one recurrent step (generation): no chunk machinery
        w = log_decay[:, 0].exp().unsqueeze(-1)
        new = w * state + kw[:, 0].unsqueeze(-1) * v[:, 0].unsqueeze(-2)
        read = new if inclusive else state
        y = (q[:, 0].unsqueeze(-2) @ read).transpose(1, 2)
        return (y if extra is None else y + extra), new
    if v.shape[-1] == 1 and log_decay.shape[-1] > 1:
        # a scalar value per head with a decay per key channel (one recurrence per channel):
        # the chunked form's L x L matrices would multiply vectors, so the exact recurrence,
        # vectorised over batch, heads and key channels, is the faster forward
        y, s = _sequential(q, kw, v, log_decay, state, inclusive)
    else:
        y, s = _chunked(q, kw, v, log_decay, state, inclusive, chunk)
    return (y if extra is None else y + extra), s


def _sequential(q: torch.Tensor, kw: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                state: torch.Tensor, inclusive: bool, block: int = 64
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token, `block` tokens' states at a time (memory [B, block, H, K, V])."""
    w = g.exp()
    ys = []
    s = state
    for t0 in range(0, q.shape[1], block):
        t1 = min(q.shape[1], t0 + block)
        kv = kw[:, t0:t1].unsqueeze(-1) * v[:, t0:t1].unsqueeze(-2)       # [B, b, H, K, V]
        states = torch.empty_like(kv)
        before = s
        for i in range(t1 - t0):
            s = torch.addcmul(kv[:, i], w[:, t0 + i].unsqueeze(-1), s)
            states[:, i] = s
        if not inclusive:
            states = torch.cat([before.unsqueeze(1), states[:, :-1]], dim=1)
        ys.append((q[:, t0:t1].unsqueeze(-1) * states).sum(-2))
    return torch.cat(ys, dim=1), s


def _chunked(q: torch.Tensor, kw: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             state: torch.Tensor, inclusive: bool, chunk: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    bsz, t = q.shape[:2]
    L = max(1, min(chunk, t))
    pad = (-t) % L
    # padding at the end: decay 1 and no write, so the final state is unchanged
    qc, kc, vc, gc = (chunks(x, L) for x in pad_time([q, kw, v, g], pad))
    # float64 cumulative log-decays: differences of large sums keep their precision
    G = gc.double().cumsum(-2)                 # inclusive, within the chunk
    Gq = G if inclusive else G - gc.double()   # what the query at t has seen
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril(0 if inclusive else -1)
    if gc.shape[-1] == 1:  # one decay per head: the pairwise decay is an L x L matrix
        a = (qc @ kc.transpose(-1, -2)) * decay_matrix(Gq[..., 0], G[..., 0], mask)
    else:
        a = intra(qc, Gq, kc, G, mask)
    y = a @ vc
    last = G[..., -1:, :]
    kv = (kc * (last - G).exp().float()).transpose(-1, -2) @ vc      # [B, H, n, K, V]
    dec = last.squeeze(-2).exp().float().unsqueeze(-1)               # [B, H, n, K or 1, 1]
    qd = qc * Gq.exp().float()
    starts = []
    s = state
    for c in range(qc.shape[2]):
        starts.append(s)
        s = dec[:, :, c] * s + kv[:, :, c]
    y = y + qd @ torch.stack(starts, dim=2)
    return y.permute(0, 2, 3, 1, 4).reshape(bsz, t + pad, q.shape[2], -1)[:, :t], s


def decay_matrix(gq: torch.Tensor, gk: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """exp(gq_t - gk_s) where `mask` [L, L] holds, else 0: gq, gk [..., L] -> [..., L, L] F32."""
    d = gq[..., :, None] - gk[..., None, :]
    return d.masked_fill(~mask, float("-inf")).exp().float()


def intra(q: torch.Tensor, gq: torch.Tensor, k: torch.Tensor, gk: torch.Tensor,
          mask: torch.Tensor, block: int = 4) -> torch.Tensor:
    """M[t, s] = sum_i q_{t,i} k_{s,i} exp(gq_{t,i} - gk_{s,i}) where `mask` [L, L] holds, else 0.

    q, k: [..., L, K] F32; gq, gk: the same, float64 cumulative log-decays (decreasing along
    L). `mask` is lower triangular. Diagonal blocks of `block` tokens are formed pairwise; a
    block of sources s < t is one matmul with both factors referenced to the block's last
    source, so each factor is exp(<= 0) and nothing overflows whatever the decay (an
    underflowing factor means a product below 1e-38).
    """
    L = q.shape[-2]
    out = q.new_zeros(q.shape[:-1] + (L,))
    for j0 in range(0, L, block):
        j1 = min(L, j0 + block)
        d = (gq[..., j0:j1, None, :] - gk[..., None, j0:j1, :]).float()
        d = d.masked_fill(~mask[j0:j1, j0:j1, None], float("-inf"))
        out[..., j0:j1, j0:j1] = (q[..., j0:j1, None, :] * d.exp() * k[..., None, j0:j1, :]).sum(-1)
        if j1 < L:
            ref = gk[..., j1 - 1:j1, :]
            qf = q[..., j1:, :] * (gq[..., j1:, :] - ref).float().exp()
            kf = k[..., j0:j1, :] * (ref - gk[..., j0:j1, :]).float().exp()
            out[..., j1:, j0:j1] = qf @ kf.transpose(-1, -2)
    return out


def diagonal_states(k_write: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                    state: torch.Tensor) -> torch.Tensor:
    """The exact recurrence, token by token: every state S_t (after token t).

    k_write [B, T, H, K], v [B, T, H, V], log_decay [B, T, H, K or 1], state [B, H, K, V]
    -> [B, T, H, K, V] F32.
    """
    out = []
    s = state
    w = log_decay.exp()
    for t in range(k_write.shape[1]):
        s = w[:, t].unsqueeze(-1) * s + k_write[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        out.append(s)
    return torch.stack(out, dim=1)


def read_states(q: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """y_t = S_t^T q_t: q [B, T, H, K], states [B, T, H, K, V] -> [B, T, H, V]."""
    return (q.unsqueeze(-2) @ states).squeeze(-2)


def diagonal_effective_attention(q: torch.Tensor, k_write: torch.Tensor,
                                 log_decay: torch.Tensor, *, inclusive: bool = True,
                                 bonus: torch.Tensor | None = None, k: torch.Tensor | None = None,
                                 block: int = 32) -> torch.Tensor:
    """A [B, H, T, T] (F32, causal) with ``A @ v == y`` of :func:`diagonal_scan` for the call.

    ``A[t, s] = sum_i q_{t,i} kw_{s,i} exp(G_{t,i} - G_{s,i})`` for s <= t (inclusive; for
    exclusive s < t with G_t taken before token t, and ``sum_i q_{t,i} bonus_i k_{t,i}`` on
    the diagonal). Pairwise decays are differences of a float64 cumulative log-decay, so long
    sequences neither overflow nor lose precision; queries are processed in blocks.
    """
    bsz, t, h, kd = q.shape
    qq, kk = q.permute(0, 2, 1, 3), k_write.permute(0, 2, 1, 3)           # [B, H, T, K]
    g = log_decay.double().permute(0, 2, 1, 3)
    cum = g.cumsum(2)
    gq = cum if inclusive else cum - g
    idx = torch.arange(t, device=q.device)
    if g.shape[-1] == 1:
        mask = idx[:, None] >= idx[None, :] if inclusive else idx[:, None] > idx[None, :]
        out = (qq @ kk.transpose(-1, -2)) * decay_matrix(gq[..., 0], cum[..., 0], mask)
    else:
        out = torch.zeros(bsz, h, t, t, dtype=torch.float32, device=q.device)
        for q0 in range(0, t, block):
            q1 = min(t, q0 + block)
            d = gq[:, :, q0:q1, None, :] - cum[:, :, None, :q1, :]       # [B, H, tq, s, K]
            rows = idx[q0:q1, None]
            mask = rows >= idx[None, :q1] if inclusive else rows > idx[None, :q1]
            d = d.masked_fill(~mask[:, :, None], float("-inf"))
            out[:, :, q0:q1, :q1] = (qq[:, :, q0:q1, None, :] * d.exp().float()
                                     * kk[:, :, None, :q1, :]).sum(-1)
    if bonus is not None:
        key = k_write if k is None else k
        out[:, :, idx, idx] = (q * bonus * key).sum(-1).permute(0, 2, 1)
    return out
