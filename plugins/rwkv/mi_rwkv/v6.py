"""RWKV-6 (Finch): ddlerp token shift, data-dependent diagonal decay, receptance-gated FFN.

Weights in the HF format (``rwkv.blocks.{i}.attention.*`` / ``feed_forward.*``). The WKV is
the shared recurrence layer's diagonal scan, exclusive with a bonus
(:mod:`mi_core.recurrence`): chunked, pairwise decays ``exp(b_{t-1} - b_s)`` (exponents <= 0,
so no overflow) within a chunk, one state update per chunk across chunks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mi_core.recurrence import diagonal_scan, written_keys

from mi_rwkv.effective_attn import effective_attention_v6
from mi_rwkv.model import LayerCtx, linear, token_shift


def wkv6(r: torch.Tensor, k: torch.Tensor, v: torch.Tensor, logw: torch.Tensor,
         u: torch.Tensor, state: torch.Tensor, k_write: torch.Tensor | None = None,
         chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The RWKV-6 WKV on the shared recurrence layer (:func:`mi_core.recurrence.diagonal_scan`).

    r, k, v, logw (log of the decay, <= 0): [B, T, H, K] F32; u (bonus): [H, K];
    state [B, H, K, V]; k_write: the key used for the state write (k scaled by state
    knockout / steering, zero at padding), default k. Returns (y [B, T, H, V], new state).
    ``y_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T)``, ``S_t = diag(w_t) S_{t-1} + k_t v_t^T``.
    """
    return diagonal_scan(r, k, v, logw, state, inclusive=False, bonus=u, k_write=k_write,
                         chunk=chunk)


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
        kw = written_keys(kf, ctx.write_scale, ctx.active)
        if ctx.active is not None:  # decay 1 at padding: the state is left as it was
            logw = logw * ctx.active.view(bsz, t, 1, 1)
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
