"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024), the linear attention of Qwen3-Next and
Qwen3.5.

Projections of the normalised residual give q, k [heads_k, d_k], v [heads_v, d_v], the gate
z [heads_v, d_v] and per value head b, a. [q | k | v] -> causal depthwise conv (no bias) ->
SiLU; q, k are L2-normalised (eps 1e-6), q is scaled by d_k^-1/2, and both are shared by the
heads_v / heads_k value heads of their group. Per value head, with ``beta = sigmoid(b)`` and
the log-decay ``g = -exp(A_log) softplus(a + dt_bias)``::

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   y_t = S_t^T q_t

(key-value layout, S [d_k, d_v]); output ``out_proj(rmsnorm_per_head(y) * w * silu(z))``.
This is the shared recurrence layer's diagonal + rank-1 transition
(:mod:`mi_core.recurrence.rank1`) with one scalar decay per head: ``a = k``,
``b = -exp(g) beta k``, written key ``beta k``; chunked (64 tokens) for the forward (the
delta rule's own chunked form, ``delta_scan``), the exact recurrence only when
``attn.hook_state`` is hooked. Two checkpoint layouts: Qwen3-Next's fused ``in_proj_qkvz`` /
``in_proj_ba`` (interleaved per key head), Qwen3.5's separate ``in_proj_qkv`` / ``in_proj_z`` /
``in_proj_b`` / ``in_proj_a``, and OLMo hybrid's ``q_proj`` / ``k_proj`` / ``v_proj`` /
``a_proj`` / ``b_proj`` / ``g_proj`` / ``o_proj`` / ``o_norm`` and one conv per projection
(``q_conv1d`` / ``k_conv1d`` / ``v_conv1d``, read as one concatenation: :data:`CONCATENATED`;
with ``beta = 2 sigmoid(b)`` where it allows negative eigenvalues); the family's key table
picks one (``"layout"``).
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import ConfigError, ConfigFields, HookRun
from mi_core.recurrence import (
    delta_scan, rank1_effective_attention, rank1_states, read_states, write_scales,
)

from mi_ssm.common import SsmState, causal_conv
from mi_ssm.settings import ACTIVATIONS, _Keys

#: The mixer's hook suffixes in execution order (``blocks.{i}.<suffix>``): the attention
#: names where they mean the same thing, plus the recurrence's own points.
POINTS = ("attn.hook_in", "attn.hook_conv", "attn.hook_q", "attn.hook_k", "attn.hook_v",
          "attn.hook_beta", "attn.hook_decay", "attn.hook_effective_attn", "attn.hook_state",
          "attn.hook_z", "attn.hook_gate")
#: HookPoint factories (``HookPoint.linear_attn_state(i)`` == ``blocks.{i}.attn.hook_state``).
FACTORIES = {"linear_attn_" + s.split(".hook_")[1]: s for s in POINTS
             if s not in ("attn.hook_in", "attn.hook_q", "attn.hook_k", "attn.hook_v",
                          "attn.hook_z")}
LAYOUTS = ("fused", "separate", "olmo")
#: OLMo hybrid's per-projection convs, which transformers concatenates into one conv on load
#: and splits in equal thirds on save (whatever the key / value widths): read as one
#: concatenation, re-split at [key_dim, key_dim, value_dim] (the MixerSpec's `concatenated`)
CONCATENATED = (("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"),)


@attrs.frozen
class GatedDeltaSettings:
    """Gated DeltaNet's shapes: value heads share the q / k of their key head's group."""

    d_model: int
    k_heads: int
    v_heads: int
    d_k: int
    d_v: int
    d_conv: int
    norm_eps: float
    layout: str = "separate"  # "fused": Qwen3-Next in_proj_qkvz / in_proj_ba; "olmo"
    beta_scale: float = 1.0  # 2: beta in (0, 2), negative eigenvalues allowed (OLMo hybrid)

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.d_k

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.d_v

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


def gated_delta_settings(r: ConfigFields, keys: Mapping[str, str],
                         hidden: int) -> GatedDeltaSettings:
    """k_heads, v_heads (a multiple of k_heads), d_k, d_v, d_conv, norm_eps (the gated norm's;
    unnamed: 1e-5, FLA's fixed value), neg_eigval (beta scaled by 2), act (silu);
    ``keys["layout"]`` is a layout name ("fused" / "separate" / "olmo"), not a config key."""
    k = _Keys(r, keys)
    act_key = keys.get("act")
    if act_key is not None:
        r.text(act_key, "silu", choices=ACTIVATIONS)
    layout = keys.get("layout", "separate")
    if layout not in LAYOUTS:
        raise ConfigError(f"{r.where}: the family's gated DeltaNet layout {layout!r} is not "
                          f"one of {LAYOUTS}")
    kh, vh = k.int("k_heads"), k.int("v_heads")
    if vh % kh:
        raise k.fail("v_heads", f"must be a multiple of the {kh} key heads")
    return GatedDeltaSettings(d_model=hidden, k_heads=kh, v_heads=vh, d_k=k.int("d_k"),
                              d_v=k.int("d_v"), d_conv=k.int("d_conv", 4),
                              norm_eps=k.number("norm_eps", 1e-5, gt=0), layout=layout,
                              beta_scale=2.0 if k.flag("neg_eigval", False) else 1.0)


def gated_delta_tensors(s: GatedDeltaSettings) -> dict[str, tuple[int, ...]]:
    """The mixer module's tensors (transformers' names) and their shapes."""
    d, h = s.d_model, s.v_heads
    out: dict[str, tuple[int, ...]] = {
        "conv1d.weight": (s.conv_dim, 1, s.d_conv), "dt_bias": (h,), "A_log": (h,),
        "norm.weight": (s.d_v,), "out_proj.weight": (d, s.value_dim)}
    if s.layout == "fused":
        out.update({"in_proj_qkvz.weight": (s.conv_dim + s.value_dim, d),
                    "in_proj_ba.weight": (2 * h, d)})
    elif s.layout == "olmo":
        out = {"q_conv1d.weight": (s.key_dim, 1, s.d_conv),   # one conv per projection
               "k_conv1d.weight": (s.key_dim, 1, s.d_conv),
               "v_conv1d.weight": (s.value_dim, 1, s.d_conv), "dt_bias": (h,), "A_log": (h,),
               "o_norm.weight": (s.d_v,), "o_proj.weight": (d, s.value_dim),
               "q_proj.weight": (s.key_dim, d), "k_proj.weight": (s.key_dim, d),
               "v_proj.weight": (s.value_dim, d), "g_proj.weight": (s.value_dim, d),
               "a_proj.weight": (h, d), "b_proj.weight": (h, d)}
    else:
        out.update({"in_proj_qkv.weight": (s.conv_dim, d), "in_proj_z.weight": (s.value_dim, d),
                    "in_proj_b.weight": (h, d), "in_proj_a.weight": (h, d)})
    return out


class _Names:
    def __init__(self, layer: int) -> None:
        for suffix in POINTS:
            setattr(self, suffix.split(".hook_")[1], f"blocks.{layer}.{suffix}")


def _unfuse(s: GatedDeltaSettings, w: dict[str, torch.Tensor]
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen3-Next's per-key-head interleaved rows -> (W_qkv [q | k | v], W_z, W_b, W_a), each
    in the head order of the separate layout (transformers' fix_query_key_value_ordering)."""
    r = s.v_heads // s.k_heads
    qkvz = w["in_proj_qkvz.weight"].view(s.k_heads, 2 * s.d_k + 2 * r * s.d_v, -1)
    q, k, v, z = qkvz.split([s.d_k, s.d_k, r * s.d_v, r * s.d_v], dim=1)
    ba = w["in_proj_ba.weight"].view(s.k_heads, 2 * r, -1)
    b, a = ba.split([r, r], dim=1)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    return torch.cat([flat(q), flat(k), flat(v)]), flat(z), flat(b), flat(a)


class GatedDeltaMixer:
    """One layer's gated DeltaNet (the :class:`mi_core.recurrence.Mixer` protocol)."""

    points = POINTS
    input_point = "attn.hook_in"
    chunk = 64

    def __init__(self, s: GatedDeltaSettings, w: dict[str, torch.Tensor], layer: int) -> None:
        self.s, self.layer, self.names = s, layer, _Names(layer)
        self.heads = s.v_heads
        if s.layout == "fused":
            self.w_qkv, self.w_z, self.w_b, self.w_a = _unfuse(s, w)
        elif s.layout == "olmo":
            self.w_qkv = torch.cat([w["q_proj.weight"], w["k_proj.weight"], w["v_proj.weight"]])
            self.w_z, self.w_b = w["g_proj.weight"], w["b_proj.weight"]
            self.w_a = w["a_proj.weight"]
            w = {**w, "norm.weight": w["o_norm.weight"], "out_proj.weight": w["o_proj.weight"],
                 "conv1d.weight": torch.cat([w[f"{p}_conv1d.weight"] for p in "qkv"])}
        else:
            self.w_qkv, self.w_z = w["in_proj_qkv.weight"], w["in_proj_z.weight"]
            self.w_b, self.w_a = w["in_proj_b.weight"], w["in_proj_a.weight"]
        self.conv_w = w["conv1d.weight"]
        self.dt_bias = w["dt_bias"].float()
        self.neg_A = -torch.exp(w["A_log"].float())                       # [v_heads]
        self.norm_w, self.w_out = w["norm.weight"], w["out_proj.weight"]

    def hook_shape(self, suffix: str, batch: int, seq: int) -> tuple[int, ...] | None:
        s = self.s
        h, kh = s.v_heads, s.k_heads
        return {"attn.hook_in": (batch, seq, s.d_model), "attn.hook_conv": (batch, seq, s.conv_dim),
                "attn.hook_q": (batch, seq, kh, s.d_k), "attn.hook_k": (batch, seq, kh, s.d_k),
                "attn.hook_v": (batch, seq, h, s.d_v), "attn.hook_beta": (batch, seq, h),
                "attn.hook_decay": (batch, seq, h),
                "attn.hook_effective_attn": (batch, h, seq, seq),
                "attn.hook_state": (batch, seq, h, s.d_k, s.d_v),
                "attn.hook_z": (batch, seq, h, s.d_v),
                "attn.hook_gate": (batch, seq, h, s.d_v)}.get(suffix)

    def new_state(self, batch: int) -> SsmState:
        s = self.s
        dev = self.w_qkv.device
        return SsmState(conv=torch.zeros(batch, s.conv_dim, s.d_conv - 1, dtype=self.w_qkv.dtype,
                                         device=dev),
                        ssm=torch.zeros(batch, s.v_heads, s.d_k, s.d_v, device=dev))

    def forward(self, x: torch.Tensor, run: HookRun, *, state: Any = None,
                active: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        """x [b, t, d_model] -> [b, t, d_model]; `state` (SsmState) updated in place."""
        s, n = self.s, self.names
        b, t, _ = x.shape
        conv, last = causal_conv(F.linear(x, self.w_qkv), self.conv_w, None,
                                 state.conv if state is not None else None, active)
        qkv = run.apply(n.conv, F.silu(conv))
        q, k, v = qkv.split([s.key_dim, s.key_dim, s.value_dim], dim=-1)
        q = run.apply(n.q, _l2(q.reshape(b, t, s.k_heads, s.d_k).float()))
        k = run.apply(n.k, _l2(k.reshape(b, t, s.k_heads, s.d_k).float()))
        v = run.apply(n.v, v.reshape(b, t, s.v_heads, s.d_v).float())
        beta = torch.sigmoid(F.linear(x, self.w_b)).float()  # in x's dtype, as transformers
        beta = run.apply(n.beta, beta * s.beta_scale if s.beta_scale != 1.0 else beta)
        g = run.apply(n.decay, self.neg_A * F.softplus(F.linear(x, self.w_a).float()
                                                        + self.dt_bias))
        rep = s.v_heads // s.k_heads
        q = q.repeat_interleave(rep, dim=2) * s.d_k ** -0.5
        k = k.repeat_interleave(rep, dim=2)
        y, final = self._core(q, k, v, beta, g, run, state, active, offset)
        y = run.apply(n.z, y)                                             # [b, t, h, d_v]
        gate = run.apply(n.gate, F.silu(F.linear(x, self.w_z).float().view(b, t, s.v_heads,
                                                                          s.d_v)))
        if state is not None:
            state.conv, state.ssm = last, final
        yd = y.to(x.dtype).float()  # transformers normalises the core output cast to the dtype
        normed = yd * torch.rsqrt(yd.pow(2).mean(-1, keepdim=True) + s.norm_eps)
        out = (self.norm_w * normed.to(x.dtype)) * gate                   # transformers' order
        return F.linear(out.to(x.dtype).reshape(b, t, s.value_dim), self.w_out)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
              g: torch.Tensor, run: HookRun, state: SsmState | None,
              active: torch.Tensor | None, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The delta rule on the shared rank-1 scan: y [b, t, h, d_v] F32, the final state.

        State knockout / steering scale token p's whole delta write (the erase along k_p
        and the add): knockout leaves ``S_p = exp(g_p) S_{p-1}``. Padding: decay 1, no write.
        """
        b, t, h, _ = v.shape
        spec = run.spec
        scale = beta
        if spec.state_knockout or spec.state_steering:
            ws = write_scales(spec.state_knockout, spec.state_steering, self.layer, t, offset,
                              h, v.device)
            scale = beta if ws is None else beta * ws[None]
        if active is not None:
            scale = scale * active[:, :, None]
            g = g * active[:, :, None]
        lg = g.unsqueeze(-1)                                              # [b, t, h, 1]
        a, kw = k, k * scale.unsqueeze(-1)
        s0 = state.ssm if state is not None else v.new_zeros(b, h, self.s.d_k, self.s.d_v)
        n = self.names
        if run.wants(n.effective_attn) or run.wants(n.state):  # the general rank-1 layout
            bb = -(lg.exp() * kw)
            if run.wants(n.effective_attn):
                run.apply(n.effective_attn, rank1_effective_attention(q, kw, lg, a, bb))
            if run.wants(n.state):
                states = run.apply(n.state, rank1_states(lg, kw, v, a, bb, s0))
                return read_states(q, states), states[:, -1]
        return delta_scan(q, lg, kw, v, a, s0, chunk=self.chunk)


def _l2(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim (the FLA / transformers l2norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def build_gated_delta(s: GatedDeltaSettings, w: dict[str, torch.Tensor], layer: int) -> Any:
    return GatedDeltaMixer(s, w, layer)
