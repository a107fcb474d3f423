"""RWKV-7 (Goose): static lerp, diag + rank-1 state transition, value residual, plain FFN.

Weights in the flash-linear-attention format (``model.layers.{i}.attn.*`` / ``ffn.*``).
In key-value layout the recurrence is
``S_t = diag(w_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T`` with ``a = -kk``,
``b = kk * iclr``, output ``y_t = S_t^T r_t``: the shared recurrence layer's diagonal +
rank-1 scan (:mod:`mi_core.recurrence`), chunked (the in-chunk removals solve a unit
lower-triangular system; each chunk maps the incoming state through one [K, K] transition
plus a [K, V] offset). RWKV-7's log-decay is >= -exp(-0.5), the scan's precondition.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mi_core.recurrence import rank1_scan, written_keys

from mi_rwkv.config import RwkvConfig
from mi_rwkv.effective_attn import effective_attention_v7
from mi_rwkv.model import LayerCtx, linear, token_shift

#: log of the RWKV-7 decay is ``-exp(-0.5) * sigmoid(w0 + lora(x))`` (0.606531 in `rwkv`).
DECAY_SCALE = math.exp(-0.5)


def wkv7(r: torch.Tensor, logw: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         a: torch.Tensor, b: torch.Tensor, state: torch.Tensor, chunk: int = 16
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The RWKV-7 WKV on the shared recurrence layer (:func:`mi_core.recurrence.rank1_scan`).
    All inputs [B, T, H, K] F32 (k: the written key, already scaled by state knockout /
    steering); state [B, H, K, V]. Returns (y [B, T, H, V], state)."""
    return rank1_scan(r, logw, k, v, a, b, state, chunk)


class V7Layer:
    """One RWKV-7 block's weights (nn.Linear layout [out, in]) and its two mixes."""

    def __init__(self, w: dict[str, torch.Tensor], layer: int, num_heads: int, head_dim: int,
                 group_norm_eps: float) -> None:
        self.ln1 = (w["attn_norm.weight"], w["attn_norm.bias"])
        self.ln2 = (w["ffn_norm.weight"], w["ffn_norm.bias"])
        a = "attn."
        self.mix = torch.stack([w[a + f"x_{n}"].reshape(-1) for n in "rwkvag"])  # [6, C]
        self.k_k, self.k_a = w[a + "k_k"].reshape(-1), w[a + "k_a"].reshape(-1)
        self.r_k = w[a + "r_k"].reshape(num_heads, head_dim)
        self.wr, self.wk, self.wv, self.wo = (w[a + f"{n}_proj.weight"] for n in "rkvo")

        def lora(n: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
            """(down [rank, C], up [C, rank], bias [C] or None) of the ``{n}_lora`` module."""
            p = a + f"{n}_lora.lora."
            return w[p + "0.weight"], w[p + "2.weight"], w.get(p + "2.bias")

        self.w1, self.w2, self.w0 = lora("w")
        self.a1, self.a2, self.a0 = lora("a")
        self.g1, self.g2, _ = lora("g")
        self.has_v_lora = layer > 0  # layer 0's value is v_first itself
        if self.has_v_lora:
            self.v1, self.v2, self.v0 = lora("v")
        self.g_norm = (w[a + "g_norm.weight"], w[a + "g_norm.bias"])
        self.ffn_x_k = w["ffn.x_k"].reshape(-1)
        self.ffn_wk, self.ffn_wv = w["ffn.key.weight"], w["ffn.value.weight"]
        self.h, self.d, self.gn_eps = num_heads, head_dim, group_norm_eps

    def time_mix(self, x: torch.Tensor, ctx: LayerCtx) -> torch.Tensor:
        """x: ln1 output [B, T, C] -> time-mix output [B, T, C]; sets ctx.v_first at layer 0."""
        run, n, i = ctx.run, ctx.names, ctx.layer
        bsz, t, c = x.shape
        shape = (bsz, t, self.h, self.d)
        shifted, ctx.state.att_shift[i] = token_shift(x, ctx.state.att_shift[i], ctx.active)
        xr, xw, xk, xv, xa, xg = (x + (shifted - x) * self.mix[j] for j in range(6))
        r = run.apply(n.attn_q, linear(xr, self.wr).view(shape))
        w_raw = linear(torch.tanh(linear(xw, self.w1)), self.w2)
        k = linear(xk, self.wk)
        v = linear(xv, self.wv)
        iclr = torch.sigmoid(linear(linear(xa, self.a1), self.a2) + self.a0)
        g = linear(torch.sigmoid(linear(xg, self.g1)), self.g2)
        kk = F.normalize((k * self.k_k).view(shape), dim=-1)
        k = run.apply(n.attn_k, (k * (1 + (iclr - 1) * self.k_a)).view(shape))
        if self.has_v_lora:
            if ctx.v_first is None:
                raise RuntimeError(f"layer {i}: the value residual needs layer 0's value")
            mixv = torch.sigmoid(linear(linear(xv, self.v1), self.v2) + self.v0).view(shape)
            v = v.view(shape) + (ctx.v_first - v.view(shape)) * mixv
        v = run.apply(n.attn_v, v.view(shape))
        if not self.has_v_lora:
            ctx.v_first = v
        logw = (-DECAY_SCALE * torch.sigmoid((w_raw + self.w0).float())).view(shape)
        if run.wants(n.rwkv_decay):
            logw = torch.log(run.apply(n.rwkv_decay, torch.exp(logw)).float().clamp_min(1e-38))
        rf, kf, vf = r.float(), k.float(), v.float()
        va, vb = -kk.float(), (kk * iclr.view(shape)).float()
        kw = written_keys(kf, ctx.write_scale, ctx.active)
        if ctx.active is not None:  # decay 1 and no removal at padding
            act = ctx.active.view(bsz, t, 1, 1)
            logw, vb = logw * act, vb * act
        if run.wants(n.rwkv_effective_attn):
            run.apply(n.rwkv_effective_attn, effective_attention_v7(rf, kw, logw, va, vb))
        y, s = wkv7(rf, logw, kw, vf, va, vb, ctx.state.wkv[i], ctx.chunk)
        ctx.state.wkv[i] = run.apply(n.rwkv_state, s)
        y = run.apply(n.attn_z, y.to(x.dtype))
        y = F.group_norm(y.reshape(bsz * t, c), self.h, self.g_norm[0], self.g_norm[1],
                         self.gn_eps).view(shape)
        y = y + (r * k * self.r_k).sum(-1, keepdim=True) * v
        return linear(y.reshape(bsz, t, c) * g, self.wo)

    def channel_mix(self, x: torch.Tensor, ctx: LayerCtx) -> torch.Tensor:
        """x: ln2 output [B, T, C] -> W_v relu(W_k x_k)^2 [B, T, C]."""
        run, n, i = ctx.run, ctx.names, ctx.layer
        shifted, ctx.state.ffn_shift[i] = token_shift(x, ctx.state.ffn_shift[i], ctx.active)
        pre = run.apply(n.mlp_pre, linear(x + (shifted - x) * self.ffn_x_k, self.ffn_wk))
        post = run.apply(n.mlp_post, torch.relu(pre).square())
        return linear(post, self.ffn_wv)


def v7_expected_shapes(prefix: str, layer: int, cfg: RwkvConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape for one fla-format RWKV-7 block (prefix ``model.layers.{i}.``)."""
    c, h, d, inter = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
    dr, ar, vr, gr = cfg.decay_rank, cfg.a_rank, cfg.v_rank, cfg.gate_rank
    a = prefix + "attn."
    shapes: dict[str, tuple[int, ...]] = {prefix + f"{n}.{p}": (c,) for n in ("attn_norm", "ffn_norm")
                                          for p in ("weight", "bias")}
    for n in "rwkvag":
        shapes[a + f"x_{n}"] = (1, 1, c)
    shapes.update({
        a + "k_k": (c,), a + "k_a": (c,), a + "r_k": (h, d),
        a + "r_proj.weight": (c, c), a + "k_proj.weight": (c, c), a + "v_proj.weight": (c, c),
        a + "o_proj.weight": (c, c),
        a + "w_lora.lora.0.weight": (dr, c), a + "w_lora.lora.2.weight": (c, dr), a + "w_lora.lora.2.bias": (c,),
        a + "a_lora.lora.0.weight": (ar, c), a + "a_lora.lora.2.weight": (c, ar), a + "a_lora.lora.2.bias": (c,),
        a + "g_lora.lora.0.weight": (gr, c), a + "g_lora.lora.2.weight": (c, gr),
        a + "g_norm.weight": (c,), a + "g_norm.bias": (c,),
        prefix + "ffn.x_k": (c,), prefix + "ffn.key.weight": (inter, c), prefix + "ffn.value.weight": (c, inter),
    })
    if layer > 0:
        shapes.update({a + "v_lora.lora.0.weight": (vr, c), a + "v_lora.lora.2.weight": (c, vr),
                       a + "v_lora.lora.2.bias": (c,)})
    return shapes
