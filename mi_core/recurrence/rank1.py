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
- :func:`delta_scan`, the same forward for the delta rule with one scalar decay per head
  (``S_t = w_t (I - kw_t k_t^T) S_{t-1} + kw_t v_t^T``), in the chunked form of the delta
  rule (the WY form: one triangular solve per chunk, the state carried chunk to chunk as
  [K, V] only), about half the matmul work of the general form.
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


def delta_scan(q: torch.Tensor, log_decay: torch.Tensor, k_write: torch.Tensor,
               v: torch.Tensor, k: torch.Tensor, state: torch.Tensor, chunk: int = 64
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule ``S_t = w_t (I - kw_t k_t^T) S_{t-1} + kw_t v_t^T``,
    ``y_t = S_t^T q_t`` (w = exp(log_decay), one scalar per head): :func:`rank1_scan` with
    ``a = k``, ``b = -w kw``, computed in the delta rule's own chunked form.

    q, k, k_write [B, T, H, K] F32 (k_write: the written key, beta k scaled by state
    knockout / steering); log_decay [B, T, H] or [B, T, H, 1] (<= 0); v [B, T, H, V]; state
    [B, H, K, V]. Returns (y [B, T, H, V], state after the call).

    In a chunk starting from S0, with G the inclusive cumulative log-decay (float64, so the
    pairwise decays exp(G_t - G_s) are exact), the values the state loses before each write,
    ``u_t = v_t - k_t^T S_t^pre``, solve ``(I + A) U = V - (e^G k) S0`` with A strictly lower,
    ``A[t, s] = e^(G_t - G_s) (k_t . kw_s)``: one unit-triangular solve with both right-hand
    sides. Then ``Y = (e^G q) S0 + M U`` (``M[t, s] = e^(G_t - G_s) (q_t . kw_s)``, s <= t)
    and ``S_end = e^(G_L) S0 + (e^(G_L - G) kw)^T U``; every exponent is <= 0.
    """
    bsz, t, h, kd = q.shape
    lg = log_decay if log_decay.dim() == 3 else log_decay[..., 0]            # [B, T, H]
    if t == 1:  # one recurrent step (generation)
        w1 = lg[:, 0].exp()[..., None, None]
        k1, kw1, v1 = k[:, 0], k_write[:, 0], v[:, 0]
        s = w1 * state
        u = v1 - (k1.unsqueeze(-2) @ s).squeeze(-2)                       # [B, H, V]
        s = s + kw1.unsqueeze(-1) * u.unsqueeze(-2)
        return (q[:, 0].unsqueeze(-2) @ s).transpose(1, 2), s
    L = max(1, min(chunk, t))
    pad = (-t) % L
    # End padding: decay 1, k = kw = 0: no write, the final state unchanged.
    # [B, H, n, L, K] made contiguous once: the batched matmuls below read them repeatedly
    qc, kc, kwc, vc = (chunks(x, L).contiguous() for x in pad_time([q, k, k_write, v], pad))
    lgc = chunks(pad_time([lg.unsqueeze(-1)], pad)[0], L)[..., 0]          # [B, H, n, L]
    g = lgc.double().cumsum(-1)
    # exp(G_t - G_s) for s <= t: the differences exact in float64, each <= 0 (so float32
    # suffices for its exp); one matrix serves A (whose unit diagonal the solve assumes) and M
    incl = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    diff = (g.unsqueeze(-1) - g.unsqueeze(-2)).float()
    dec = diff.masked_fill_(~incl, float("-inf")).exp_()                  # [B, H, n, L, L]
    kwt = kwc.transpose(-1, -2)
    a = (kc @ kwt).mul_(dec)            # strictly lower part used: A[t, s] = e^.. (k_t . kw_s)
    eg = g.exp().float().unsqueeze(-1)                                     # [B, H, n, L, 1]
    u_v = torch.linalg.solve_triangular(a, vc, upper=False, unitriangular=True)
    w_k = torch.linalg.solve_triangular(a, eg * kc, upper=False, unitriangular=True)
    m = (qc @ kwt).mul_(dec)                                               # U = u_v - w_k S0
    qe = eg * qc
    gl = g[..., -1:]
    kend = ((gl - g).exp().float().unsqueeze(-1) * kwc).transpose(-1, -2)  # [B, H, n, K, L]
    wl = gl.exp().float().unsqueeze(-1)                                    # [B, H, n, 1, 1]
    ys = []
    s = state
    for c in range(qc.shape[2]):
        uc = u_v[:, :, c] - w_k[:, :, c] @ s
        ys.append(qe[:, :, c] @ s + m[:, :, c] @ uc)
        s = wl[:, :, c] * s + kend[:, :, c] @ uc
    y = torch.stack(ys, dim=2)                                             # [B, H, n, L, V]
    # contiguous [B, T, H, V]: the mixer's norm and gate read it elementwise
    return y.permute(0, 2, 3, 1, 4).reshape(bsz, t + pad, h, -1)[:, :t].contiguous(), s


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
