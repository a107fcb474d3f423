"""Lightning attention (Qin et al. 2024), the linear attention of MiniMax-Text-01.

Per layer: ``[q | k | v] = act(qkv_proj(x))`` with each head's rows ``[q | k | v]``
(``head_dim`` each; no normalisation, no scaling), then per head h a linear attention with a
constant exponential decay ``exp(-s_h)`` a token::

    S_t = exp(-s_h) S_{t-1} + k_t v_t^T,   y_t = S_t^T q_t

(key-value layout, S [d_head, d_head]); output ``out_proj(sigmoid(output_gate(x)) *
rmsnorm(y) * w)``, the RMS norm over all heads' ``heads * d_head`` channels with transformers'
fixed eps 1e-6. The slopes ``s_h`` are the checkpoint's ``slope_rate`` buffer (transformers
reads it back as stored; it computes ``base^(h+1) * (1 - layer / (layers - 1 + 1e-5) +
1e-5)`` with ``base = 2^(-8 / heads)`` when it creates one). transformers evaluates the same
recurrence in blocks of ``block_size`` tokens from the ``query_decay`` / ``key_decay`` /
``diagonal_decay`` buffers it saves beside the slopes; those are functions of the slopes and
the block size, checked at load, and the blocking changes only the rounding.

On the shared recurrence layer this is :func:`mi_core.recurrence.diagonal_scan` (inclusive)
with one scalar log-decay ``-s_h`` per head: chunked (64 tokens) for the forward, the exact
recurrence only when ``attn.hook_state`` is hooked, the exact effective attention ``A`` with
``A @ v == y`` when ``attn.hook_effective_attn`` is. Padding is a token with decay 1 and no
write (transformers zeroes the pads' q, k, v but still decays its state there: the same for
left padding, where the state is still zero).
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import ConfigFields, HookRun, WeightLoadError
from mi_core.recurrence import (
    diagonal_effective_attention, diagonal_scan, diagonal_states, read_states, write_scales,
    written_keys,
)

from mi_ssm.settings import _Keys

#: The mixer's hook suffixes in execution order (``blocks.{i}.<suffix>``): attention's names
#: where they mean the same thing, plus the recurrence's own points.
POINTS = ("attn.hook_in", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_decay",
          "attn.hook_effective_attn", "attn.hook_state", "attn.hook_z", "attn.hook_gate")
#: transformers' ACT2FN spellings of the activation on [q | k | v]
ACTS = {"silu": F.silu, "swish": F.silu, "relu": F.relu, "gelu": F.gelu}
#: the norm of the heads' outputs: transformers' MiniMaxRMSNorm default (no config key)
NORM_EPS = 1e-6


@attrs.frozen
class LightningSettings:
    """Lightning attention's shapes: `heads` heads of `head_dim`, transformers' block size."""

    d_model: int
    heads: int
    head_dim: int
    block_size: int
    act: str = "silu"

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim


def lightning_settings(r: ConfigFields, keys: Mapping[str, str],
                       hidden: int) -> LightningSettings:
    """heads, head_dim (absent or null: hidden / heads), block_size (default 256), act (the
    activation of [q | k | v], default silu)."""
    k = _Keys(r, keys)
    heads = k.int("heads")
    head_dim = k.int("head_dim", None)
    if head_dim is None:
        if hidden % heads:
            raise k.fail("heads", f"must divide hidden_size {hidden} (no head_dim is given)")
        head_dim = hidden // heads
    act = r.text(keys["act"], "silu", choices=ACTS) if "act" in keys else "silu"
    return LightningSettings(d_model=hidden, heads=heads, head_dim=head_dim,
                             block_size=k.int("block_size", 256), act=act)


def lightning_tensors(s: LightningSettings) -> dict[str, tuple[int, ...]]:
    """The mixer module's tensors (transformers' MiniMaxLightningAttention) and shapes, the
    decay buffers included (persistent: transformers saves and reads them)."""
    d, e, h, b = s.d_model, s.inner, s.heads, s.block_size
    return {"qkv_proj.weight": (3 * e, d), "output_gate.weight": (e, d),
            "norm.weight": (e,), "out_proj.weight": (d, e), "slope_rate": (h, 1, 1),
            "query_decay": (h, b, 1), "key_decay": (h, b, 1), "diagonal_decay": (1, h, b, b)}


def decay_buffers(slope: torch.Tensor, block: int) -> dict[str, torch.Tensor]:
    """transformers' ``decay_factors`` of `slope` [heads, 1, 1] (F32), as it computes them."""
    r = torch.arange(block, dtype=torch.float32, device=slope.device) + 1
    diag = slope * (r[:, None] - r[None, :])[None, None]
    return {"query_decay": torch.exp(-slope * r[:, None]),
            "key_decay": torch.exp(-slope * (block - r[:, None])),
            "diagonal_decay": torch.exp(torch.where(diag >= 0, -diag, float("-inf")))}


@attrs.define(eq=False)
class LinearState:
    """One lightning layer's recurrent state [batch, heads, d_head (key), d_head (value)], F32."""

    ssm: torch.Tensor


class _Names:
    def __init__(self, layer: int) -> None:
        for suffix in POINTS:
            setattr(self, suffix.split(".hook_")[1], f"blocks.{layer}.{suffix}")


class LightningMixer:
    """One layer's lightning attention (the :class:`mi_core.recurrence.Mixer` protocol)."""

    points = POINTS
    input_point = "attn.hook_in"
    chunk = 64

    def __init__(self, s: LightningSettings, w: dict[str, torch.Tensor], layer: int) -> None:
        self.s, self.layer, self.names = s, layer, _Names(layer)
        self.heads = s.heads
        self.w_qkv, self.w_gate = w["qkv_proj.weight"], w["output_gate.weight"]
        self.norm_w, self.w_out = w["norm.weight"], w["out_proj.weight"]
        slope = w["slope_rate"].float()
        self._check_buffers(slope, w)
        self.neg_slope = -slope.view(s.heads)                             # [heads]
        self.act = ACTS[s.act]

    def _check_buffers(self, slope: torch.Tensor, w: dict[str, torch.Tensor]) -> None:
        """The stored block decays must be the slopes' (transformers computes with them; we
        compute from the slopes): a mismatch is refused, not run with other numbers."""
        if not bool(torch.isfinite(slope).all()) or bool((slope < 0).any()):
            raise WeightLoadError(f"layer {self.layer}: lightning attention's slope_rate must be "
                                  f"finite and >= 0, got {slope.flatten().tolist()}")
        stored_dtype = w["query_decay"].dtype
        tol = 1e-5 if stored_dtype in (torch.float32, torch.float64) else 1e-2
        for name, want in decay_buffers(slope, self.s.block_size).items():
            got = w[name].float()
            if not torch.allclose(got, want, rtol=tol, atol=tol):
                raise WeightLoadError(
                    f"layer {self.layer}: lightning attention's {name} differs from the decays "
                    f"its slope_rate and block_size {self.s.block_size} give (max abs diff "
                    f"{(got - want).abs().max().item():.3g}); transformers would compute with "
                    f"the stored tensor")

    def hook_shape(self, suffix: str, batch: int, seq: int) -> tuple[int, ...] | None:
        s = self.s
        h, d = s.heads, s.head_dim
        return {"attn.hook_in": (batch, seq, s.d_model), "attn.hook_q": (batch, seq, h, d),
                "attn.hook_k": (batch, seq, h, d), "attn.hook_v": (batch, seq, h, d),
                "attn.hook_decay": (batch, seq, h),
                "attn.hook_effective_attn": (batch, h, seq, seq),
                "attn.hook_state": (batch, seq, h, d, d), "attn.hook_z": (batch, seq, h, d),
                "attn.hook_gate": (batch, seq, h, d)}.get(suffix)

    def new_state(self, batch: int) -> LinearState:
        s = self.s
        return LinearState(torch.zeros(batch, s.heads, s.head_dim, s.head_dim,
                                       device=self.w_qkv.device))

    def forward(self, x: torch.Tensor, run: HookRun, *, state: LinearState | None = None,
                active: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        """x [b, t, d_model] (the normalised residual) -> [b, t, d_model]; `state` updated
        in place."""
        s, n = self.s, self.names
        b, t, _ = x.shape
        h, d = s.heads, s.head_dim
        qkv = self.act(F.linear(x, self.w_qkv)).view(b, t, h, 3 * d)
        q, k, v = qkv.split(d, dim=-1)
        q = run.apply(n.q, q.float())                                     # [b, t, h, d]
        k = run.apply(n.k, k.float())
        v = run.apply(n.v, v.float())
        g = self.neg_slope.expand(b, t, h)                                # [b, t, h]
        if run.wants(n.decay):  # a copy: an edit in place must not reach the slopes
            g = run.apply(n.decay, g.clone())
        y, final = self._core(q, k, v, g, run, state, active, offset)
        y = run.apply(n.z, y)                                             # [b, t, h, d] F32
        if state is not None:
            state.ssm = final
        # transformers: the scan's output in the model's dtype, RMS-normed in F32 (cast back),
        # times the gain, times sigmoid of the gate in the model's dtype
        yd = y.to(x.dtype).reshape(b, t, s.inner).float()
        normed = (yd * torch.rsqrt(yd.pow(2).mean(-1, keepdim=True) + NORM_EPS)).to(x.dtype)
        gate = run.apply(n.gate, torch.sigmoid(F.linear(x, self.w_gate)).view(b, t, h, d))
        out = gate.reshape(b, t, s.inner).to(x.dtype) * (self.norm_w * normed)
        return F.linear(out, self.w_out)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
              run: HookRun, state: LinearState | None, active: torch.Tensor | None,
              offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """y [b, t, h, d] F32 and the state after the call. State knockout / steering scale
        the write ``k_p v_p^T`` at their positions and heads (the decay still applies);
        padding: decay 1, no write."""
        b, t, h, d = v.shape
        spec = run.spec
        scales = write_scales(spec.state_knockout, spec.state_steering, self.layer, t, offset,
                              h, v.device) if spec.state_knockout or spec.state_steering else None
        kw = written_keys(k, scales, active)
        lg = (g if active is None else g * active[:, :, None]).float().unsqueeze(-1)
        n = self.names
        if run.wants(n.effective_attn):
            run.apply(n.effective_attn, diagonal_effective_attention(q, kw, lg))
        s0 = state.ssm if state is not None else v.new_zeros(b, h, d, d)
        if run.wants(n.state):
            states = run.apply(n.state, diagonal_states(kw, v, lg, s0))
            return read_states(q, states), states[:, -1]
        return diagonal_scan(q, k, v, lg, s0, k_write=kw, chunk=self.chunk)


def build_lightning(s: LightningSettings, w: dict[str, torch.Tensor], layer: int) -> Any:
    return LightningMixer(s, w, layer)
