"""Multi-head latent attention (DeepSeek-V2 / V3), as transformers' ``DeepseekV2Attention`` /
``DeepseekV3Attention`` compute it: the projections that produce q, k and v per head.

- Queries: ``q_b(rms(q_a(x)))`` (a rank-`q_lora_rank` latent, ``attn.hook_q_latent``
  [b, s, q_lora_rank] after its norm) or one projection ``q_proj(x)`` (DeepSeek-V2-Lite,
  no latent and no point).
- Keys and values: ``kv_a_proj_with_mqa(x)`` splits into a latent [b, s, kv_lora_rank] and one
  rotary key [b, s, rope_dim] shared by every head; the latent, RMS-normed
  (``attn.hook_kv_latent`` [b, s, kv_lora_rank]: what transformers caches), goes through
  ``kv_b_proj`` to each head's key part without positions [nope_dim] and its value
  [v_head_dim].
- Each head's q and k are ``[nope | rope]`` (``attn.hook_q`` / ``hook_k`` [b, s, h,
  nope + rope], the shared rotary key repeated per head); only the trailing rope dims are
  rotated (:func:`mi_transformer.attention.attention`, ``LayerSettings.rope_tail``); values
  are ``attn.hook_v`` [b, s, h, v_head_dim]. Attention, the pattern, ``hook_z`` [b, s, h,
  v_head_dim] and the output projection then run as for every other layer.

The KV cache holds each head's rotated key and value (not the latent): exact, but more memory
than transformers' latent cache. The latent norms use epsilon 1e-6, transformers' default for
them whatever ``rms_norm_eps`` says.
"""

from __future__ import annotations

from typing import Callable

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import HookRun

from mi_transformer.config import MlaConfig, NormType
from mi_transformer.norm import Norm


@attrs.define(eq=False)
class MlaWeights:
    """One layer's latent projections (torch.nn.Linear layout)."""

    config: MlaConfig
    kv_a: torch.Tensor  # [kv_lora_rank + rope_dim, d_model]
    kv_norm: Norm  # [kv_lora_rank]
    kv_b: torch.Tensor  # [heads * (nope_dim + v_head_dim), kv_lora_rank]
    q: torch.Tensor | None = None  # [heads * (nope + rope), d_model] without a q latent
    q_a: torch.Tensor | None = None  # [q_lora_rank, d_model]
    q_norm: Norm | None = None  # [q_lora_rank]
    q_b: torch.Tensor | None = None  # [heads * (nope + rope), q_lora_rank]
    kv_a_bias: torch.Tensor | None = None  # attention_bias: the two input projections' biases
    q_a_bias: torch.Tensor | None = None


def mla_qkv(w: MlaWeights, x: torch.Tensor, num_heads: int, run: HookRun, q_latent: str,
            kv_latent: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [b, s, d_model] (normalised) -> q, k [b, s, heads, nope + rope] (before RoPE) and
    v [b, s, heads, v_head_dim], through the latent hooks."""
    c = w.config
    b, s, _ = x.shape
    if w.q_a is not None and w.q_norm is not None and w.q_b is not None:
        lat = run.apply(q_latent, w.q_norm(F.linear(x, w.q_a, w.q_a_bias)))
        q = F.linear(lat, w.q_b)
    else:
        q = F.linear(x, w.q)  # type: ignore[arg-type]
    q = q.view(b, s, num_heads, c.nope_dim + c.rope_dim)
    latent, k_rope = F.linear(x, w.kv_a, w.kv_a_bias).split([c.kv_lora_rank, c.rope_dim], -1)
    latent = run.apply(kv_latent, w.kv_norm(latent))
    kv = F.linear(latent, w.kv_b).view(b, s, num_heads, c.nope_dim + c.v_head_dim)
    k_nope, v = kv.split([c.nope_dim, c.v_head_dim], dim=-1)
    k = torch.cat([k_nope, k_rope[:, :, None, :].expand(b, s, num_heads, c.rope_dim)], dim=-1)
    return q, k, v


def mla_shapes(c: MlaConfig, heads: int, d_model: int, bias: bool
               ) -> dict[str, tuple[int, ...]]:
    """Tensor name inside the attention module -> shape (without the output projection)."""
    qk = c.nope_dim + c.rope_dim
    out: dict[str, tuple[int, ...]] = {
        "kv_a_proj_with_mqa.weight": (c.kv_lora_rank + c.rope_dim, d_model),
        "kv_a_layernorm.weight": (c.kv_lora_rank,),
        "kv_b_proj.weight": (heads * (c.nope_dim + c.v_head_dim), c.kv_lora_rank)}
    if c.q_lora_rank is None:
        out["q_proj.weight"] = (heads * qk, d_model)
    else:
        out.update({"q_a_proj.weight": (c.q_lora_rank, d_model),
                    "q_a_layernorm.weight": (c.q_lora_rank,),
                    "q_b_proj.weight": (heads * qk, c.q_lora_rank)})
    if bias:  # transformers: attention_bias adds biases to q_a and kv_a (and o_proj)
        out["kv_a_proj_with_mqa.bias"] = (c.kv_lora_rank + c.rope_dim,)
        if c.q_lora_rank is not None:
            out["q_a_proj.bias"] = (c.q_lora_rank,)
    return out


def load_mla(c: MlaConfig, get: Callable[[str], torch.Tensor],
             opt: Callable[[str], torch.Tensor | None]) -> MlaWeights:
    """One layer's MlaWeights from its tensors (names as in :func:`mla_shapes`)."""
    norm = lambda name: Norm(NormType.RMS, c.latent_eps, get(name))  # noqa: E731
    if c.q_lora_rank is None:
        q_parts: dict[str, object] = {"q": get("q_proj.weight")}
    else:
        q_parts = {"q_a": get("q_a_proj.weight"), "q_norm": norm("q_a_layernorm.weight"),
                   "q_b": get("q_b_proj.weight"), "q_a_bias": opt("q_a_proj.bias")}
    return MlaWeights(config=c, kv_a=get("kv_a_proj_with_mqa.weight"),
                      kv_norm=norm("kv_a_layernorm.weight"), kv_b=get("kv_b_proj.weight"),
                      kv_a_bias=opt("kv_a_proj_with_mqa.bias"), **q_parts)  # type: ignore[arg-type]
