"""What Mamba-1 and Mamba-2 share: the hook points, the recurrent state (convolution window
and SSM state), the causal convolution, and the SSM core on the shared recurrence layer.

The SSM core is ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``, ``y_t = C_t . h_t + D x_t``
per head. In the recurrence layer's key-value layout (:mod:`mi_core.recurrence`) the state
is [d_state, head_dim]: query C, key B, value ``dt * x``, log-decay ``dt * A`` (one per head
for Mamba-2, one per channel and state dimension for Mamba-1, whose heads are its d_inner
channels with head_dim 1). The hook ``ssm.hook_state`` shows it as [head_dim, d_state].
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import HookRun
from mi_core.recurrence import (
    diagonal_effective_attention, diagonal_scan, diagonal_states, read_states, write_scales,
    written_keys,
)

#: The mixer's hook suffixes in execution order (``blocks.{i}.<suffix>``).
POINTS = ("ssm.hook_in", "ssm.hook_in_proj", "ssm.hook_conv", "ssm.hook_dt", "ssm.hook_B",
          "ssm.hook_C", "ssm.hook_effective_attn", "ssm.hook_state", "ssm.hook_y",
          "ssm.hook_gate")
#: HookPoint factories the plugin declares (``HookPoint.ssm_state(i)``, ...).
FACTORIES = {"ssm_" + s.split(".hook_")[1]: s for s in POINTS}


class Names:
    """The hook names of one layer's mixer, as attributes (``names.conv`` ...)."""

    def __init__(self, layer: int) -> None:
        for suffix in POINTS:
            setattr(self, suffix.split(".hook_")[1], f"blocks.{layer}.{suffix}")


@attrs.define(eq=False)
class SsmState:
    """One mixer's recurrent state: `conv` [batch, channels, d_conv - 1] (the last inputs of
    the causal convolution, model dtype) and `ssm` [batch, heads, d_state, head_dim] (F32,
    key-value layout)."""

    conv: torch.Tensor
    ssm: torch.Tensor


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                prev: torch.Tensor | None, active: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution over time.

    x [B, T, C]; weight [C, 1, K] (as stored); prev [B, C, K - 1] (the inputs before this
    call; None: zeros). Returns (out [B, T, C], the last K - 1 inputs). With padding
    (`active` [B, T] False) each row's real tokens are convolved with its previous real
    tokens only (the pads are skipped, as if the row had none), so a padded row gives the
    numbers it has alone, wherever the pads are.
    """
    b, t, c = x.shape
    k = weight.shape[-1]
    xt = x.transpose(1, 2)                                               # [B, C, T]
    if prev is None:
        prev = xt.new_zeros(b, c, k - 1)
    if active is None:
        full = torch.cat([prev.to(xt.dtype), xt], dim=-1)
        out = F.conv1d(full.to(weight.dtype), weight, bias, groups=c)
        return out.transpose(1, 2).to(x.dtype), full[..., full.shape[-1] - (k - 1):]
    # padding: move each row's real tokens to the front (stable), convolve, move back
    order = torch.argsort((~active).to(torch.int8), dim=1, stable=True)   # [B, T]
    compact = xt.gather(2, order[:, None, :].expand(b, c, t))
    full = torch.cat([prev.to(xt.dtype), compact], dim=-1)
    out = F.conv1d(full.to(weight.dtype), weight, bias, groups=c).to(x.dtype)
    back = torch.empty_like(out).scatter_(2, order[:, None, :].expand(b, c, t), out)
    n_real = active.sum(1)                                               # [B]
    idx = n_real[:, None] + torch.arange(k - 1, device=x.device)[None]    # last K-1 real inputs
    last = full.gather(2, idx[:, None, :].expand(b, c, k - 1))
    return back.transpose(1, 2), last


@attrs.define(eq=False)
class Scan:
    """The SSM core's inputs for one call, per head: x [B, T, H, P], dt [B, T, H] (F32),
    B / C [B, T, H, N], log-decay [B, T, H, N or 1] (F32), D [H]."""

    x: torch.Tensor
    dt: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    log_decay: torch.Tensor
    D: torch.Tensor


def ssm_core(s: Scan, names: Names, run: HookRun, layer: int, state: torch.Tensor | None,
             active: torch.Tensor | None, offset: int, chunk: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """y [B, T, H, P] (F32, D skip included) and the state after the call [B, H, N, P].

    State knockout / steering scale the write ``dt_s B_s x_s`` at their positions and heads;
    padding leaves the state as it was (decay 1, no write). The effective attention and the
    per-step states are computed only when their points are hooked; an intervention at
    ``ssm.hook_state`` changes the states the outputs read (and the state carried on).
    """
    bsz, t, h, p = s.x.shape
    xf = s.x.float()
    v = s.dt.unsqueeze(-1) * xf                                           # [B, T, H, P]
    q, k = s.C.float(), s.B.float()
    spec = run.spec
    scales = write_scales(spec.state_knockout, spec.state_steering, layer, t, offset, h,
                          s.x.device) if spec.state_knockout or spec.state_steering else None
    kw = written_keys(k, scales, active)
    g = s.log_decay if active is None else s.log_decay * active[:, :, None, None]
    d_skip = s.D.float()[:, None] * xf                                    # [B, T, H, P]
    if run.wants(names.effective_attn):
        a = diagonal_effective_attention(q, kw, g) * s.dt.permute(0, 2, 1)[:, :, None, :]
        idx = torch.arange(t, device=a.device)
        a[:, :, idx, idx] += s.D.float()[None, :, None]
        run.apply(names.effective_attn, a)
    s0 = state if state is not None else xf.new_zeros(bsz, h, k.shape[-1], p)
    if run.wants(names.state):
        states = run.apply(names.state, diagonal_states(kw, v, g, s0).transpose(-1, -2))
        states = states.transpose(-1, -2)                                 # [B, T, H, N, P]
        y, final = read_states(q, states), states[:, -1]
    else:
        y, final = diagonal_scan(q, k, v, g, s0, k_write=kw, chunk=chunk)
    return run.apply(names.y, y + d_skip), final
