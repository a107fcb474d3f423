"""RWKV-6 (Finch): ddlerp token shift, data-dependent diagonal decay, receptance-gated FFN.

Weights in the HF format (``rwkv.blocks.{i}.attention.*`` / ``feed_forward.*``). The WKV
recurrence runs chunked: within a chunk of L tokens the pairwise decays
``exp(b_{t-1} - b_s)`` (b: cumulative log-decay, exponents <= 0, so no overflow) give an
L x L matrix; across chunks the state is carried by L-independent matmuls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mi_rwkv.effective_attn import effective_attention_v6
from mi_rwkv.model import LayerCtx, linear, token_shift


def _chunks(x: torch.Tensor, length: int) -> torch.Tensor:
    """[B, T, H, K] (T a multiple of `length`) -> [B, H, n, L, K]."""
    b, t, h, k = x.shape
    return x.view(b, t // length, length, h, k).permute(0, 3, 1, 2, 4)


def _pad(xs: list[torch.Tensor], pad: int) -> list[torch.Tensor]:
    return [F.pad(x, (0, 0, 0, 0, 0, pad)) for x in xs] if pad else xs


def wkv6(r: torch.Tensor, k: torch.Tensor, v: torch.Tensor, logw: torch.Tensor,
         u: torch.Tensor, state: torch.Tensor, k_write: torch.Tensor | None = None,
         chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The RWKV-6 WKV, chunked.

    r, k, v, logw (log of the decay, <= 0): [B, T, H, K] F32; u (bonus): [H, K];
    state [B, H, K, V]; k_write: the key used for the state write (k scaled by state
    knockout / steering, zero at padding), default k. Returns (y [B, T, H, V], new state).
    ``y_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T)``, ``S_t = diag(w_t) S_{t-1} + k_t v_t^T``.
    """
    bsz, t, h, kd = r.shape
    kw = k if k_write is None else k_write
    bonus = (r * u * k).sum(-1, keepdim=True) * v
    if t == 1:  # one recurrent step (generation): no chunk machinery
        r1, k1, v1, w1 = r[:, 0], kw[:, 0], v[:, 0], logw[:, 0].exp()
        y1 = (r1.unsqueeze(-2) @ state).squeeze(-2)
        return (y1.unsqueeze(1) + bonus), w1.unsqueeze(-1) * state + k1.unsqueeze(-1) * v1.unsqueeze(-2)
    L = max(1, min(chunk, t))
    pad = (-t) % L
    # Padding at the end: decay 1 and no write, so the final state is unchanged.
    rc, kc, vc, lw = (_chunks(x, L) for x in _pad([r, kw, v, logw], pad))
    # Cumulative log-decays in float64: differences of large cumulative sums keep their
    # precision (RWKV-6 decays reach tens of nats per token).
    b = lw.double().cumsum(-2)            # inclusive cumulative log-decay within the chunk
    be = b - lw.double()                  # exclusive: b_{t-1}
    strict = torch.ones(L, L, dtype=torch.bool, device=r.device).tril(-1)
    a = _intra(rc, be, kc, b, strict)                              # [B, H, n, L, L]
    y = a @ vc
    blast = b[..., -1:, :]
    kv = (kc * (blast - b).exp().float()).transpose(-1, -2) @ vc   # [B, H, n, K, V]
    dec = blast.squeeze(-2).exp().float().unsqueeze(-1)            # [B, H, n, K, 1]
    q = rc * be.exp().float()
    starts = []
    s = state
    for c in range(rc.shape[2]):
        starts.append(s)
        s = dec[:, :, c] * s + kv[:, :, c]
    y = y + q @ torch.stack(starts, dim=2)
    y = y.permute(0, 2, 3, 1, 4).reshape(bsz, t + pad, h, -1)[:, :t]
    return y + bonus, s


def _intra(q: torch.Tensor, gq: torch.Tensor, k: torch.Tensor, gk: torch.Tensor,
           mask: torch.Tensor, block: int = 4) -> torch.Tensor:
    """M[t, s] = sum_i q_{t,i} k_{s,i} exp(gq_{t,i} - gk_{s,i}) where `mask` [L, L] holds, else 0.

    q, k: [B, H, n, L, K] F32; gq, gk: the same, float64 cumulative log-decays (decreasing
    along L; gq is gk or its exclusive form). `mask` is lower triangular. Diagonal blocks of
    `block` tokens are formed pairwise; a block of sources s < t is one matmul with both
    factors referenced to the block's last source, so each factor is exp(<= 0) and nothing
    overflows whatever the decay (an underflowing factor means a product below 1e-38).
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


class V6Layer:
    """One RWKV-6 block's weights (nn.Linear layout [out, in]) and its two mixes."""

    def __init__(self, w: dict[str, torch.Tensor], num_heads: int, head_dim: int,
                 group_norm_eps: float) -> None:
        self.ln1 = (w["ln1.weight"], w["ln1.bias"])
        self.ln2 = (w["ln2.weight"], w["ln2.bias"])
        a = "attention."
        self.maa_x = w[a + "time_maa_x"].reshape(-1)
        self.maa = torch.stack([w[a + f"time_maa_{n}"].reshape(-1) for n in "wkvrg"])  # [5, C]
        self.maa_w1 = w[a + "time_maa_w1"]             # [C, 5R]
        self.maa_w2 = w[a + "time_maa_w2"]             # [5, R, C]
        self.decay = w[a + "time_decay"].reshape(-1)   # [C]
        self.decay_w1 = w[a + "time_decay_w1"]         # [C, D]
        self.decay_w2 = w[a + "time_decay_w2"]         # [D, C]
        self.u = w[a + "time_faaaa"].reshape(num_heads, head_dim).float()
        self.wr, self.wk, self.wv = w[a + "receptance.weight"], w[a + "key.weight"], w[a + "value.weight"]
        self.wg, self.wo = w[a + "gate.weight"], w[a + "output.weight"]
        self.ln_x = (w[a + "ln_x.weight"], w[a + "ln_x.bias"])
        f = "feed_forward."
        self.ffn_maa_k = w[f + "time_maa_k"].reshape(-1)
        self.ffn_maa_r = w[f + "time_maa_r"].reshape(-1)
        self.ffn_wk, self.ffn_wr, self.ffn_wv = w[f + "key.weight"], w[f + "receptance.weight"], w[f + "value.weight"]
        self.h, self.d, self.gn_eps = num_heads, head_dim, group_norm_eps

    def time_mix(self, x: torch.Tensor, ctx: LayerCtx) -> torch.Tensor:
        """x: ln1 output [B, T, C] -> time-mix output [B, T, C]."""
        run, n, i = ctx.run, ctx.names, ctx.layer
        bsz, t, c = x.shape
        shifted, ctx.state.att_shift[i] = token_shift(x, ctx.state.att_shift[i], ctx.active)
        xx = shifted - x
        lora = torch.tanh((x + xx * self.maa_x) @ self.maa_w1).view(bsz * t, 5, -1).transpose(0, 1)
        m = torch.bmm(lora, self.maa_w2).view(5, bsz, t, c) + self.maa.view(5, 1, 1, c)
        xw, xk, xv, xr, xg = (x + xx * m[j] for j in range(5))
        shape = (bsz, t, self.h, self.d)
        r = run.apply(n.attn_q, linear(xr, self.wr).view(shape))
        k = run.apply(n.attn_k, linear(xk, self.wk).view(shape))
        v = run.apply(n.attn_v, linear(xv, self.wv).view(shape))
        g = F.silu(linear(xg, self.wg))
        wlog = (self.decay + torch.tanh(xw @ self.decay_w1) @ self.decay_w2).float().view(shape)
        logw = -torch.exp(wlog)
        if run.wants(n.rwkv_decay):
            logw = torch.log(run.apply(n.rwkv_decay, torch.exp(logw)).float().clamp_min(1e-38))
        rf, kf, vf = r.float(), k.float(), v.float()
        kw = kf
        if ctx.write_scale is not None:
            kw = kw * ctx.write_scale.view(1, t, 1, 1)
        if ctx.active is not None:
            act = ctx.active.view(bsz, t, 1, 1)
            kw = kw * act
            logw = logw * act
        if run.wants(n.rwkv_effective_attn):
            run.apply(n.rwkv_effective_attn, effective_attention_v6(rf, kf, kw, logw, self.u))
        y, s = wkv6(rf, kf, vf, logw, self.u, ctx.state.wkv[i], kw, ctx.chunk)
        ctx.state.wkv[i] = run.apply(n.rwkv_state, s)
        y = run.apply(n.attn_z, y.to(x.dtype))
        y = F.group_norm(y.reshape(bsz * t, c), self.h, self.ln_x[0], self.ln_x[1], self.gn_eps)
        return linear(y.view(bsz, t, c) * g, self.wo)

    def channel_mix(self, x: torch.Tensor, ctx: LayerCtx) -> torch.Tensor:
        """x: ln2 output [B, T, C] -> sigmoid(r) * (W_v relu(W_k x_k)^2) [B, T, C]."""
        run, n, i = ctx.run, ctx.names, ctx.layer
        shifted, ctx.state.ffn_shift[i] = token_shift(x, ctx.state.ffn_shift[i], ctx.active)
        xx = shifted - x
        pre = run.apply(n.mlp_pre, linear(x + xx * self.ffn_maa_k, self.ffn_wk))
        post = run.apply(n.mlp_post, torch.relu(pre).square())
        return torch.sigmoid(linear(x + xx * self.ffn_maa_r, self.ffn_wr)) * linear(post, self.ffn_wv)


def v6_expected_shapes(prefix: str, c: int, h: int, d: int, inter: int, tm: int, td: int
                       ) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape for one HF-format RWKV-6 block (prefix ``rwkv.blocks.{i}.``)."""
    a, f = prefix + "attention.", prefix + "feed_forward."
    shapes: dict[str, tuple[int, ...]] = {prefix + f"{n}.{p}": (c,) for n in ("ln1", "ln2")
                                          for p in ("weight", "bias")}
    for n in ("x", "w", "k", "v", "r", "g"):
        shapes[a + f"time_maa_{n}"] = (1, 1, c)
    shapes.update({
        a + "time_maa_w1": (c, 5 * tm), a + "time_maa_w2": (5, tm, c), a + "time_decay": (1, 1, c),
        a + "time_decay_w1": (c, td), a + "time_decay_w2": (td, c), a + "time_faaaa": (h, d),
        a + "receptance.weight": (c, c), a + "key.weight": (c, c), a + "value.weight": (c, c),
        a + "gate.weight": (c, c), a + "output.weight": (c, c), a + "ln_x.weight": (c,),
        a + "ln_x.bias": (c,), f + "time_maa_k": (1, 1, c), f + "time_maa_r": (1, 1, c),
        f + "key.weight": (inter, c), f + "receptance.weight": (c, c), f + "value.weight": (c, inter),
    })
    return shapes
