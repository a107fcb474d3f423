"""Experts stored stacked, as gpt-oss and Llama 4 publish them: one tensor per projection for
all experts, ``gate_up_proj`` [E, d_model, 2 d_expert] and ``down_proj`` [E, d_expert, d_model]
(``x @ W``, not torch.nn.Linear's ``x @ W.T``), optionally with biases [E, 2 d_expert] and
[E, d_model] (gpt-oss publishes them as MXFP4, which the loader dequantizes into this layout:
:mod:`mi_transformer.quant`). Gate and up are the two halves of the 2 d_expert columns
(``concat``: Llama 4) or alternate (``interleaved``: gpt-oss, gate in the even columns).

Each :class:`FusedExpert` is a view of expert e's slice (no copy) and computes what
transformers does with it: one matmul for gate and up, then the split. gpt-oss's experts apply
a clamped SwiGLU instead of ``act(gate) * up``: ``gate`` clamped above at `limit`, ``up`` to
[-limit, limit], ``(up + 1) * gate * sigmoid(alpha * gate)``.
"""

from __future__ import annotations

from typing import Callable

import attrs
import torch

from mi_transformer.config import MoeConfig


@attrs.define(eq=False)
class FusedExpert:
    """Expert e of a stacked checkpoint; called as :class:`mi_transformer.moe.ExpertWeights`."""

    gate_up: torch.Tensor  # [d_model, 2 d_expert], x @ gate_up
    down: torch.Tensor  # [d_expert, d_model]
    interleaved: bool  # gate in the even columns (gpt-oss), else the first half (Llama 4)
    gate_up_bias: torch.Tensor | None = None  # [2 d_expert]
    down_bias: torch.Tensor | None = None  # [d_model]
    limit: float | None = None  # gpt-oss's clamped SwiGLU
    alpha: float = 1.702

    def __call__(self, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
                 ) -> torch.Tensor:
        """x [n, d_model] -> [n, d_model]."""
        gu = x @ self.gate_up
        if self.gate_up_bias is not None:
            gu = gu + self.gate_up_bias
        if self.interleaved:
            gate, up = gu[..., ::2], gu[..., 1::2]
        else:
            gate, up = gu.chunk(2, dim=-1)
        if self.limit is not None:
            gate = gate.clamp(min=None, max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            h = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
        else:
            h = act(gate) * up
        out = h @ self.down
        return out + self.down_bias if self.down_bias is not None else out

    @property
    def w_gate(self) -> torch.Tensor:
        """[d_expert, d_model] in torch.nn.Linear layout (a view)."""
        g = self.gate_up[:, ::2] if self.interleaved else self.gate_up.chunk(2, dim=-1)[0]
        return g.T

    @property
    def w_up(self) -> torch.Tensor:
        u = self.gate_up[:, 1::2] if self.interleaved else self.gate_up.chunk(2, dim=-1)[1]
        return u.T

    @property
    def w_down(self) -> torch.Tensor:
        return self.down.T


def fused_shapes(m: str, c: MoeConfig, d_model: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of one layer's stacked experts under `m` (``...mlp.``)."""
    e, f = c.num_experts, c.expert_size
    out = {m + "experts.gate_up_proj": (e, d_model, 2 * f),
           m + "experts.down_proj": (e, f, d_model)}
    if c.expert_bias:
        out[m + "experts.gate_up_proj_bias"] = (e, 2 * f)
        out[m + "experts.down_proj_bias"] = (e, d_model)
    return out


def load_fused(m: str, c: MoeConfig, get: Callable[[str], torch.Tensor]) -> list[FusedExpert]:
    """One layer's experts as views of the stacked tensors."""
    gu, dn = get(m + "experts.gate_up_proj"), get(m + "experts.down_proj")
    gub = get(m + "experts.gate_up_proj_bias") if c.expert_bias else None
    dnb = get(m + "experts.down_proj_bias") if c.expert_bias else None
    return [FusedExpert(gu[e], dn[e], c.fused == "interleaved",
                        None if gub is None else gub[e], None if dnb is None else dnb[e],
                        c.swiglu_limit, c.swiglu_alpha) for e in range(c.num_experts)]
