"""Mamba-2: state-space duality (Dao & Gu 2024).

``in_proj`` -> [z | xBC | dt]; xBC -> causal depthwise conv -> SiLU -> [x | B | C] (B, C per
group of heads); ``dt = clamp(softplus(dt + dt_bias), dt_limit)`` [heads]; per head h,
``h_t = exp(dt_t A_h) h_{t-1} + dt_t B_t x_t^T``, ``y_t = C_t . h_t + D_h x_t``; output
``out_proj(rmsnorm_grouped(y * silu(z)) * w)``. The recurrence is the shared layer's
diagonal scan with one scalar decay per head (its state-space-dual matrix form).

Falcon-H1's variant (settings named only by its key table): in_proj's five parts scaled by
their multipliers (``proj_scales``, its mup vector) before the split, d_inner set apart from
expand (``d_ssm``), the norm before the gate (``(rmsnorm(y) * w) * silu(z)``) or no norm
(``y * silu(z)``, ``gate_norm``), and out_proj's bias apart from in_proj's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from mi_core.plugin import HookRun

from mi_ssm.common import POINTS, Names, Scan, SsmState, causal_conv, ssm_core
from mi_ssm.settings import Mamba2Settings


def mamba2_tensors(s: Mamba2Settings) -> dict[str, tuple[int, ...]]:
    """The mixer module's tensors (names as in transformers' Mamba2Mixer) and their shapes."""
    d, e, h = s.d_model, s.d_inner, s.n_heads
    out = {"in_proj.weight": (e + s.conv_dim + h, d), "conv1d.weight": (s.conv_dim, 1, s.d_conv),
           "dt_bias": (h,), "A_log": (h,), "D": (h,), "out_proj.weight": (d, e)}
    if s.gate_norm != "none":
        out["norm.weight"] = (e,)
    if s.conv_bias:
        out["conv1d.bias"] = (s.conv_dim,)
    if s.proj_bias:
        out["in_proj.bias"] = (e + s.conv_dim + h,)
    if s.has_out_bias:
        out["out_proj.bias"] = (d,)
    return out


class Mamba2Mixer:
    """One layer's Mamba-2 mixer (the :class:`mi_core.recurrence.Mixer` protocol)."""

    points = POINTS
    input_point = "ssm.hook_in"
    chunk = 64

    def __init__(self, s: Mamba2Settings, w: dict[str, torch.Tensor], layer: int) -> None:
        self.s, self.layer, self.names = s, layer, Names(layer)
        self.heads = s.n_heads
        self.w_in, self.b_in = w["in_proj.weight"], w.get("in_proj.bias")
        self.conv_w, self.conv_b = w["conv1d.weight"], w.get("conv1d.bias")
        self.dt_bias = w["dt_bias"].float()
        self.A = -torch.exp(w["A_log"].float())                           # [heads]
        self.D = w["D"]
        self.norm_w = w.get("norm.weight")
        self.w_out, self.b_out = w["out_proj.weight"], w.get("out_proj.bias")
        #: [2E + 2GN + H] multipliers of in_proj's parts (Falcon-H1), in the weights' dtype
        self.proj_scale = None
        if s.proj_scales is not None:
            sizes = (s.d_inner, s.d_inner, s.n_groups * s.d_state, s.n_groups * s.d_state,
                     s.n_heads)
            self.proj_scale = torch.cat([torch.full((n,), v) for n, v in zip(
                sizes, s.proj_scales)]).to(device=self.w_in.device, dtype=self.w_in.dtype)

    def hook_shape(self, suffix: str, batch: int, seq: int) -> tuple[int, ...] | None:
        s = self.s
        e, h, g, n = s.d_inner, s.n_heads, s.n_groups, s.d_state
        return {"ssm.hook_in": (batch, seq, s.d_model),
                "ssm.hook_in_proj": (batch, seq, e + s.conv_dim + h),
                "ssm.hook_conv": (batch, seq, s.conv_dim), "ssm.hook_dt": (batch, seq, h),
                "ssm.hook_B": (batch, seq, g, n), "ssm.hook_C": (batch, seq, g, n),
                "ssm.hook_effective_attn": (batch, h, seq, seq),
                "ssm.hook_state": (batch, seq, h, s.head_dim, n),
                "ssm.hook_y": (batch, seq, h, s.head_dim), "ssm.hook_gate": (batch, seq, e),
                }.get(suffix)

    def new_state(self, batch: int) -> SsmState:
        s, w = self.s, self.w_in
        return SsmState(conv=w.new_zeros(batch, s.conv_dim, s.d_conv - 1),
                        ssm=torch.zeros(batch, s.n_heads, s.d_state, s.head_dim, device=w.device))

    def forward(self, x: torch.Tensor, run: HookRun, *, state: SsmState | None = None,
                active: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        """x [B, T, d_model] (the block's normalised input) -> [B, T, d_model]."""
        s, n = self.s, self.names
        b, t, _ = x.shape
        e, h, gs, ns = s.d_inner, s.n_heads, s.n_groups, s.d_state
        proj = F.linear(x, self.w_in, self.b_in)
        if self.proj_scale is not None:  # Falcon-H1: each part by its multiplier
            proj = proj * self.proj_scale
        proj = run.apply(n.in_proj, proj)
        z, xbc, dt = proj.split([e, s.conv_dim, h], dim=-1)
        conv, last = causal_conv(xbc, self.conv_w, self.conv_b,
                                 state.conv if state is not None else None, active)
        xbc = run.apply(n.conv, F.silu(conv))
        xs, B, C = xbc.split([e, gs * ns, gs * ns], dim=-1)
        lo, hi = s.dt_limit
        dt = run.apply(n.dt, F.softplus(dt.float() + self.dt_bias).clamp(lo, hi))   # [B, T, H]
        B = run.apply(n.B, B.reshape(b, t, gs, ns))
        C = run.apply(n.C, C.reshape(b, t, gs, ns))
        per = h // gs  # heads per group
        scan = Scan(x=xs.reshape(b, t, h, s.head_dim), dt=dt,
                    B=B.repeat_interleave(per, dim=2), C=C.repeat_interleave(per, dim=2),
                    log_decay=(dt * self.A).unsqueeze(-1), D=self.D)
        y, final = ssm_core(scan, n, run, self.layer, state.ssm if state is not None else None,
                            active, offset, self.chunk)
        gate = run.apply(n.gate, F.silu(z.float()))
        if state is not None:
            state.conv, state.ssm = last, final
        return F.linear(self._gated_norm(y.reshape(b, t, e), gate).to(x.dtype), self.w_out,
                        self.b_out)

    def _gated_norm(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """RMS norm of y * gate over each group's d_inner / n_groups channels, in F32, times
        the gain (transformers' MambaRMSNormGated, norm after the gate); Falcon-H1's norm
        before the gate ((norm(y) * w) * gate) or no norm (y * gate)."""
        kind = self.s.gate_norm
        if kind == "none":
            return y.float() * gate
        g = (y.float() * gate if kind == "after_gate" else y.float()).unflatten(
            -1, (self.s.n_groups, -1))
        g = self.norm_w * (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.s.norm_eps)
                           ).flatten(-2)
        return g if kind == "after_gate" else g * gate


def build_mamba2(s: Mamba2Settings, w: dict[str, torch.Tensor], layer: int) -> Any:
    return Mamba2Mixer(s, w, layer)
