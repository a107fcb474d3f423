"""Mamba-1: the selective scan (Gu & Dao 2023), Falcon-Mamba's variant (weightless RMS
norms of dt, B and C) and Jamba's (the same norms with gains).

``in_proj`` -> [x | z]; x -> causal depthwise conv -> SiLU -> ``x_proj`` -> [dt_r | B | C];
``dt = softplus(dt_proj(dt_r))`` [d_inner]; per channel c and state dimension n,
``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``, ``y_t = C_t . h_t + D x_t``; output
``out_proj(y * silu(z))``. The recurrence is the shared layer's diagonal scan with heads =
the d_inner channels (head_dim 1, a decay per state dimension).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from mi_core.plugin import HookRun

from mi_ssm.common import POINTS, Names, Scan, SsmState, causal_conv, ssm_core
from mi_ssm.settings import MambaSettings


def mamba_tensors(s: MambaSettings) -> dict[str, tuple[int, ...]]:
    """The mixer module's tensors (names as in transformers' MambaMixer) and their shapes."""
    d, e, n, r = s.d_model, s.d_inner, s.d_state, s.dt_rank
    out = {"in_proj.weight": (2 * e, d), "conv1d.weight": (e, 1, s.d_conv),
           "x_proj.weight": (r + 2 * n, e), "dt_proj.weight": (e, r), "dt_proj.bias": (e,),
           "A_log": (e, n), "D": (e,), "out_proj.weight": (d, e)}
    if s.conv_bias:
        out["conv1d.bias"] = (e,)
    if s.proj_bias:
        out.update({"in_proj.bias": (2 * e,), "out_proj.bias": (d,)})
    if s.bcdt_norm_weights:  # Jamba
        out.update({"dt_layernorm.weight": (r,), "b_layernorm.weight": (n,),
                    "c_layernorm.weight": (n,)})
    return out


def _rms(x: torch.Tensor, eps: float, w: torch.Tensor | None = None) -> torch.Tensor:
    """RMS norm over the last axis in F32, back in x's dtype, then times the gain `w` if any
    (Falcon-Mamba's weightless B / C / dt norms; Jamba's JambaRMSNorm)."""
    xf = x.float()
    out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return out if w is None else w * out


class MambaMixer:
    """One layer's Mamba-1 mixer (the :class:`mi_core.recurrence.Mixer` protocol)."""

    points = POINTS
    input_point = "ssm.hook_in"
    chunk = 16

    def __init__(self, s: MambaSettings, w: dict[str, torch.Tensor], layer: int) -> None:
        self.s, self.layer, self.names = s, layer, Names(layer)
        self.heads = s.d_inner
        self.w_in, self.b_in = w["in_proj.weight"], w.get("in_proj.bias")
        self.conv_w, self.conv_b = w["conv1d.weight"], w.get("conv1d.bias")
        self.w_x, self.w_dt, self.b_dt = w["x_proj.weight"], w["dt_proj.weight"], w["dt_proj.bias"]
        self.A = -torch.exp(w["A_log"].float())                          # [d_inner, d_state]
        self.D = w["D"]
        self.w_out, self.b_out = w["out_proj.weight"], w.get("out_proj.bias")
        self.bcdt_w = tuple(w.get(f"{k}_layernorm.weight") for k in ("dt", "b", "c"))

    def hook_shape(self, suffix: str, batch: int, seq: int) -> tuple[int, ...] | None:
        s = self.s
        e, n = s.d_inner, s.d_state
        return {"ssm.hook_in": (batch, seq, s.d_model), "ssm.hook_in_proj": (batch, seq, 2 * e),
                "ssm.hook_conv": (batch, seq, e), "ssm.hook_dt": (batch, seq, e),
                "ssm.hook_B": (batch, seq, 1, n), "ssm.hook_C": (batch, seq, 1, n),
                "ssm.hook_effective_attn": (batch, e, seq, seq),
                "ssm.hook_state": (batch, seq, e, 1, n), "ssm.hook_y": (batch, seq, e, 1),
                "ssm.hook_gate": (batch, seq, e)}.get(suffix)

    def new_state(self, batch: int) -> SsmState:
        s, w = self.s, self.w_in
        return SsmState(conv=w.new_zeros(batch, s.d_inner, s.d_conv - 1),
                        ssm=torch.zeros(batch, s.d_inner, s.d_state, 1, device=w.device))

    def forward(self, x: torch.Tensor, run: HookRun, *, state: SsmState | None = None,
                active: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        """x [B, T, d_model] (the block's normalised input) -> [B, T, d_model]."""
        s, n = self.s, self.names
        b, t, _ = x.shape
        proj = run.apply(n.in_proj, F.linear(x, self.w_in, self.b_in))   # [B, T, 2E]
        xi, z = proj.split(s.d_inner, dim=-1)
        conv, last = causal_conv(xi, self.conv_w, self.conv_b,
                                 state.conv if state is not None else None, active)
        xc = run.apply(n.conv, F.silu(conv))                              # [B, T, E]
        dt_r, B, C = F.linear(xc, self.w_x).split([s.dt_rank, s.d_state, s.d_state], dim=-1)
        if s.bcdt_norm_eps is not None:
            dt_r, B, C = (_rms(v, s.bcdt_norm_eps, g) for v, g in zip((dt_r, B, C), self.bcdt_w))
        dt = run.apply(n.dt, F.softplus((dt_r @ self.w_dt.T).float() + self.b_dt.float()))
        B = run.apply(n.B, B.unsqueeze(2))                                # [B, T, 1, N]
        C = run.apply(n.C, C.unsqueeze(2))
        e = s.d_inner
        scan = Scan(x=xc.unsqueeze(-1), dt=dt, B=B.expand(b, t, e, s.d_state),
                    C=C.expand(b, t, e, s.d_state), log_decay=dt.unsqueeze(-1) * self.A,
                    D=self.D)
        y, final = ssm_core(scan, n, run, self.layer, state.ssm if state is not None else None,
                            active, offset, self.chunk)
        gate = run.apply(n.gate, F.silu(z.float()))
        if state is not None:
            state.conv, state.ssm = last, final
        out = (y.reshape(b, t, e) * gate).to(x.dtype)
        return F.linear(out, self.w_out, self.b_out)


def build_mamba(s: MambaSettings, w: dict[str, torch.Tensor], layer: int) -> Any:
    return MambaMixer(s, w, layer)
