"""The gated short convolution of LFM2 (Liquid AI): a depthwise causal convolution over a few
tokens between two input-dependent gates.

``in_proj`` -> [B | C | x] (d_model channels each); per channel,
``conv_t = sum_{j=0..K-1} w_{K-1-j} (B x)_{t-j}`` (+ the conv bias), ``y_t = C_t conv_t``;
output ``out_proj(y)``. No activation, no norm. The recurrent state is the convolution's
window: the last K - 1 written values ``B x`` (K = ``d_conv``, LFM2's ``conv_L_cache``).

Read as a recurrence (the convention of :mod:`mi_ssm.common`), ``B_s x_s`` is token s's
write into the window and C_t reads it: the output is exactly ``y = A @ x`` per channel with
the causal banded matrix ``A[c, t, s] = C_t[c] w[c, K-1-(t-s)] B_s[c]`` for
``0 <= t - s < K`` (the **effective attention**, [batch, d_model, seq, seq]; the channels are
the heads, each of head_dim 1, as Mamba-1's), plus ``C_t * bias`` where the conv has a bias
(LFM2's published checkpoints have none). State knockout / steering scale token s's write
``B_s x_s`` (per channel: ``target_heads`` are channels), which reaches the outputs of
tokens s .. s + K - 1.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import ConfigFields, HookRun
from mi_core.recurrence import write_scales

from mi_ssm.common import causal_conv
from mi_ssm.settings import _Keys

#: The mixer's hook suffixes in execution order (``blocks.{i}.<suffix>``).
POINTS = ("conv.hook_in", "conv.hook_in_proj", "conv.hook_B", "conv.hook_C", "conv.hook_x",
          "conv.hook_effective_attn", "conv.hook_state", "conv.hook_conv", "conv.hook_y")
#: HookPoint factories (``HookPoint.short_conv_state(i)`` == ``blocks.{i}.conv.hook_state``).
FACTORIES = {"short_conv_" + s.split(".hook_")[1]: s for s in POINTS}


@attrs.frozen
class ShortConvSettings:
    """The short convolution's shapes: d_model channels, a window of `d_conv` tokens."""

    d_model: int
    d_conv: int
    bias: bool = False  # in_proj, conv and out_proj biases (LFM2's conv_bias)


def short_conv_settings(r: ConfigFields, keys: Mapping[str, str],
                        hidden: int) -> ShortConvSettings:
    """d_conv (the window, default 3: LFM2's conv_L_cache) and bias (default false)."""
    k = _Keys(r, keys)
    return ShortConvSettings(d_model=hidden, d_conv=k.int("d_conv", 3),
                             bias=k.flag("bias", False))


def short_conv_tensors(s: ShortConvSettings) -> dict[str, tuple[int, ...]]:
    """The mixer module's tensors (transformers' Lfm2ShortConv names) and their shapes."""
    d = s.d_model
    out: dict[str, tuple[int, ...]] = {"in_proj.weight": (3 * d, d),
                                       "conv.weight": (d, 1, s.d_conv),
                                       "out_proj.weight": (d, d)}
    if s.bias:
        out.update({"in_proj.bias": (3 * d,), "conv.bias": (d,), "out_proj.bias": (d,)})
    return out


@attrs.define(eq=False)
class ConvState:
    """The convolution's window: the last d_conv - 1 writes ``B x``, [batch, d_model,
    d_conv - 1] (model dtype), oldest first."""

    conv: torch.Tensor


class _Names:
    def __init__(self, layer: int) -> None:
        for suffix in POINTS:
            setattr(self, suffix.split(".hook_")[1], f"blocks.{layer}.{suffix}")


class ShortConvMixer:
    """One layer's gated short convolution (the :class:`mi_core.recurrence.Mixer` protocol)."""

    points = POINTS
    input_point = "conv.hook_in"

    def __init__(self, s: ShortConvSettings, w: dict[str, torch.Tensor], layer: int) -> None:
        self.s, self.layer, self.names = s, layer, _Names(layer)
        self.heads = s.d_model  # state specs address channels
        self.w_in, self.b_in = w["in_proj.weight"], w.get("in_proj.bias")
        self.conv_w, self.conv_b = w["conv.weight"], w.get("conv.bias")
        self.w_out, self.b_out = w["out_proj.weight"], w.get("out_proj.bias")

    def hook_shape(self, suffix: str, batch: int, seq: int) -> tuple[int, ...] | None:
        d = self.s.d_model
        return {"conv.hook_in": (batch, seq, d), "conv.hook_in_proj": (batch, seq, 3 * d),
                "conv.hook_B": (batch, seq, d), "conv.hook_C": (batch, seq, d),
                "conv.hook_x": (batch, seq, d), "conv.hook_effective_attn": (batch, d, seq, seq),
                "conv.hook_state": (batch, seq, d, self.s.d_conv),
                "conv.hook_conv": (batch, seq, d), "conv.hook_y": (batch, seq, d)}.get(suffix)

    def new_state(self, batch: int) -> ConvState:
        return ConvState(conv=self.w_in.new_zeros(batch, self.s.d_model, self.s.d_conv - 1))

    def forward(self, x: torch.Tensor, run: HookRun, *, state: Any = None,
                active: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        """x [b, t, d_model] (the block's normalised input) -> [b, t, d_model]; `state`
        (ConvState) updated in place. Computed in the model's dtype, as transformers."""
        n, d = self.names, self.s.d_model
        t = x.shape[1]
        proj = run.apply(n.in_proj, F.linear(x, self.w_in, self.b_in))
        B, C, v = proj.split([d, d, d], dim=-1)
        B, C, v = run.apply(n.B, B), run.apply(n.C, C), run.apply(n.x, v)
        bx = B * v                                                        # the writes
        spec = run.spec
        scales = write_scales(spec.state_knockout, spec.state_steering, self.layer, t, offset,
                              d, x.device) if spec.state_knockout or spec.state_steering \
            else None
        if scales is not None:
            bx = bx * scales.to(bx.dtype)
        prev = state.conv if state is not None else None
        if run.wants(n.effective_attn):
            run.apply(n.effective_attn, self._effective_attention(B, C, scales, active))
        if run.wants(n.state):  # the window each token reads, hooked, then read
            windows = run.apply(n.state, conv_windows(bx, prev, active, self.s.d_conv))
            conv = torch.einsum("btck,ck->btc", windows.float(), self.conv_w[:, 0].float())
            conv = (conv if self.conv_b is None else conv + self.conv_b.float()).to(x.dtype)
            last = windows[:, -1, :, 1:].to(bx.dtype)  # the last slot's: its row's last real
        else:
            conv, last = causal_conv(bx, self.conv_w, self.conv_b, prev, active)
        conv = run.apply(n.conv, conv)
        y = run.apply(n.y, C * conv)
        if state is not None:
            state.conv = last
        return F.linear(y, self.w_out, self.b_out)

    def _effective_attention(self, B: torch.Tensor, C: torch.Tensor,
                             scales: torch.Tensor | None, active: torch.Tensor | None
                             ) -> torch.Tensor:
        """A [b, d_model, t, t] (F32) with ``A @ x == y - C * conv_bias`` per channel at the
        real positions: ``A[c, t, s] = C_t w[K-1-lag] B_s`` (times the write scale of s) for
        the lag 0 <= lag < K between real tokens t and s counted in real tokens (pads are
        skipped, as the convolution skips them); zero elsewhere."""
        b, t, d = B.shape
        k = self.s.d_conv
        rank = _ranks(active, b, t, B.device)                              # [b, t]
        lag = rank[:, :, None] - rank[:, None, :]                         # [b, t(query), s]
        ok = (lag >= 0) & (lag < k)
        if active is not None:
            ok = ok & active[:, :, None] & active[:, None, :]
        taps = self.conv_w[:, 0].float()                                   # [d, K]
        w = taps[:, (k - 1 - lag).clamp(0, k - 1)]                         # [d, b, t, s]
        w = w.permute(1, 0, 2, 3) * ok[:, None].to(w.dtype)
        write = B.float() if scales is None else B.float() * scales[None]
        return C.float().transpose(1, 2)[..., None] * w * write.transpose(1, 2)[:, :, None]


def _ranks(active: torch.Tensor | None, b: int, t: int, device: torch.device) -> torch.Tensor:
    """[b, t] each slot's index among its row's real tokens (a pad: that of the real token
    before it; -1 before any)."""
    if active is None:
        return torch.arange(t, device=device).expand(b, t)
    return active.long().cumsum(1) - 1


def conv_windows(x: torch.Tensor, prev: torch.Tensor | None, active: torch.Tensor | None,
                 k: int) -> torch.Tensor:
    """The window a depthwise causal convolution of width `k` reads at each slot:
    [b, t, c, k] from x [b, t, c] (oldest first, the slot's own value last) and the carried
    `prev` [b, c, k - 1] (None: zeros). Pads are skipped (each row's real tokens convolve
    with its previous real tokens only); at a pad the window is the one of the real token
    before it (before any: ``[0, prev]``), as the state is left as it was."""
    b, t, c = x.shape
    xt = x.transpose(1, 2)                                               # [b, c, t]
    if prev is None:
        prev = xt.new_zeros(b, c, k - 1)
    if active is not None:  # each row's real tokens to the front (stable)
        order = torch.argsort((~active).to(torch.int8), dim=1, stable=True)
        xt = xt.gather(2, order[:, None, :].expand(b, c, t))
    ext = torch.cat([xt.new_zeros(b, c, 1), prev.to(xt.dtype), xt], dim=-1)  # [b, c, k + t]
    every = ext.unfold(-1, k, 1)                                         # [b, c, t + 1, k]
    idx = _ranks(active, b, t, x.device) + 1                             # [b, t]
    win = every.gather(2, idx[:, None, :, None].expand(b, c, t, k))      # [b, c, t, k]
    return win.permute(0, 2, 1, 3)


def build_short_conv(s: ShortConvSettings, w: dict[str, torch.Tensor], layer: int) -> Any:
    return ShortConvMixer(s, w, layer)
