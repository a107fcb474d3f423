"""Linear recurrences whose transition is a diagonal decay plus a rank-1 term.

In key-value layout: ``S_t = diag(w_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T`` and
``y_t = S_t^T q_t`` (w = exp(g), g <= 0). With ``a = -kappa``, ``b = kappa * lr`` this is a
delta rule (the state forgets what it held along kappa before the write); with one scalar
decay per head (g [..., 1]), ``a = k``, ``b = -w beta k`` and the written key ``beta k`` it is
the gated delta rule ``S_t = w_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``.

- :func:`rank1_scan`, the forward, chunked: inside a chunk the removed values
  ``u_t = a_t^T S_{t-1}`` solve a unit lower-triangular L x L system (pairwise decays
  ``exp(g_t - g_s)``), and each chunk maps the incoming state through one [K, K]
  transition plus a [K, V] offset. Precondition of the in-chunk factors: the log-decay of a
  token is bounded (>= about -0.6 here, so over 16 tokens each factor stays within exp(+-5));
  a mixer with faster decays must use a shorter chunk. A scalar decay per head has no such
  precondition: its pairwise decays form one exact L x L matrix (exponents <= 0).
- :func:`rank1_states`, the exact recurrence token by token (every per-step state).
- :func:`rank1_effective_attention`, A [B, H, T, T] with ``A @ v == y`` for the call.
"""

from __future__ import annotations

import torch

from mi_core.recurrence.diagonal import chunks, decay_matrix, pad_time


def rank1_scan(q: torch.Tensor, log_decay: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               a: torch.Tensor, b: torch.Tensor, state: torch.Tensor, chunk: int = 16
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """All inputs [B, T, H, K] F32 (k: the written key, already scaled by state knockout /
    steering; log_decay may be [B, T, H, 1], one decay per head); v [B, T, H, V]; state
    [B, H, K, V]. Returns (y [B, T, H, V], state after the call)."""
    bsz, t, h, kd = q.shape
    if t == 1:  # one recurrent step (generation): no chunk machinery
        q1, w1, k1, v1, a1, b1 = (x[:, 0] for x in (q, log_decay.exp(), k, v, a, b))
        sa = (a1.unsqueeze(-2) @ state)                                  # [B, H, 1, V]
        s = w1.unsqueeze(-1) * state + b1.unsqueeze(-1) * sa + k1.unsqueeze(-1) * v1.unsqueeze(-2)
        return (q1.unsqueeze(-2) @ s).transpose(1, 2), s
    L = max(1, min(chunk, t))
    pad = (-t) % L
    # End padding: decay 1, a = b = k = 0, so the final state is unchanged.
    rc, lw, kc, vc, ac, bc = (chunks(x, L) for x in pad_time([q, log_decay, k, v, a, b], pad))
    g = lw.double().cumsum(-2)          # inclusive cumulative log-decay in the chunk (float64)
    ge = g - lw.double()                # exclusive (state before token t)
    dev = q.device
    strict = torch.ones(L, L, dtype=torch.bool, device=dev).tril(-1)
    incl = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    m_ab, m_ak = _intra(ac, ge, bc, g, strict), _intra(ac, ge, kc, g, strict)   # [B, H, n, L, L]
    m_rb, m_rk = _intra(rc, g, bc, g, incl), _intra(rc, g, kc, g, incl)
    # u = (I - m_ab)^-1 (a e^ge S0 + m_ak v); m_ab is strictly lower (nilpotent), so the
    # inverse is (I + N)(I + N^2)(I + N^4)... : log2(L) batched matmuls, no triangular solve.
    inv = torch.eye(L, device=dev, dtype=q.dtype) + m_ab
    power = m_ab
    for _ in range(max(0, (L - 1).bit_length() - 1)):
        power = power @ power
        inv = inv + inv @ power
    w_s0 = inv @ (ac * ge.exp().float())                                       # u = w_s0 @ S0 + u_v
    u_v = inv @ (m_ak @ vc)
    qs = rc * g.exp().float() + m_rb @ w_s0                                   # y = qs @ S0 + y_in
    y = m_rb @ u_v + m_rk @ vc
    gl = g[..., -1:, :]
    decay_to_end = (gl - g).exp().float()
    bd, kdec = bc * decay_to_end, kc * decay_to_end
    diag = gl.squeeze(-2).exp().float().expand(*gl.shape[:-2], kd)   # [B, H, n, K]
    trans = torch.diag_embed(diag) + bd.transpose(-1, -2) @ w_s0   # [B, H, n, K, K]
    offs = bd.transpose(-1, -2) @ u_v + kdec.transpose(-1, -2) @ vc                # [B, H, n, K, V]
    starts = []
    s = state
    for c in range(rc.shape[2]):
        starts.append(s)
        s = trans[:, :, c] @ s + offs[:, :, c]
    y = y + qs @ torch.stack(starts, dim=2)
    return y.permute(0, 2, 3, 1, 4).reshape(bsz, t + pad, h, -1)[:, :t], s


def _intra(q: torch.Tensor, gq: torch.Tensor, k: torch.Tensor, gk: torch.Tensor,
           mask: torch.Tensor) -> torch.Tensor:
    """M[t, s] = sum_i q_{t,i} k_{s,i} exp(gq_{t,i} - gk_{s,i}) where `mask` [L, L] holds, else 0.

    One matmul with both factors referenced to the chunk midpoint (the bounded-decay
    precondition of the module keeps each factor within exp(+-5) over 16 tokens); a scalar
    decay per head (gq, gk [..., L, 1]) multiplies q k^T by the exact pairwise decays.
    """
    if gq.shape[-1] == 1:
        return (q @ k.transpose(-1, -2)) * decay_matrix(gq[..., 0], gk[..., 0], mask)
    mid = gk[..., gk.shape[-2] // 2: gk.shape[-2] // 2 + 1, :]
    qf = q * (gq - mid).float().exp()
    kf = k * (mid - gk).float().exp()
    return (qf @ kf.transpose(-1, -2)) * mask


def rank1_states(log_decay: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                 b: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """The exact recurrence token by token: [B, T, H, K, V], the state after each token."""
    out = []
    s = state
    w = log_decay.exp()
    for t in range(k.shape[1]):
        sa = a[:, t].unsqueeze(-2) @ s
        s = (w[:, t].unsqueeze(-1) * s + b[:, t].unsqueeze(-1) * sa
             + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2))
        out.append(s)
    return torch.stack(out, dim=1)


def rank1_effective_attention(q: torch.Tensor, k_write: torch.Tensor, log_decay: torch.Tensor,
                              a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """q, k_write, log_decay, a, b [B, T, H, K] -> A [B, H, T, T] (F32).

    With transitions ``G_t = diag(w_t) + b_t a_t^T``, ``A[t, s] = q_t^T G_t ... G_{s+1} k_s``
    (s <= t), by the backward linear functional ``q <- G_s^T q = w_s * q + a_s (b_s . q)``.
    """
    bsz, t, h, kd = q.shape
    rr, kk, ww, aa, bb = (x.float().permute(0, 2, 1, 3)
                          for x in (q, k_write, log_decay.exp(), a, b))
    acc = torch.zeros(bsz, h, t, kd, dtype=torch.float32, device=q.device)
    out = torch.zeros(bsz, h, t, t, dtype=torch.float32, device=q.device)
    for s in range(t - 1, -1, -1):
        acc[:, :, s] = rr[:, :, s]                  # the query at t = s joins (P_{s,s} = I)
        out[:, :, :, s] = (acc * kk[:, :, s, None, :]).sum(-1)
        # acc_t <- G_s^T acc_t for every query t >= s (rows t < s are still zero)
        acc = acc * ww[:, :, s, None, :] + (acc * bb[:, :, s, None, :]).sum(-1, keepdim=True) \
            * aa[:, :, s, None, :]
    return out
