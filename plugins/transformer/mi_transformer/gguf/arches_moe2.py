"""GGUF architectures of gpt-oss (``gpt-oss``), DeepSeek-V2 / V3 (``deepseek2``) and Llama 4
(``llama4``), the families of :mod:`mi_transformer.config.families_moe2`.

What llama.cpp's converter (``convert_hf_to_gguf.py``: ``GptOssModel``, ``DeepseekV2Model``,
``Llama4Model``) changes, undone here:

- gpt-oss: the published MXFP4 experts are repacked as ggml MXFP4 blocks (dequantised by the
  ``gguf`` package like every other type); the stacked ``gate_up_proj`` [E, d_model, 2 d_mlp]
  whose columns alternate gate / up is split into ``ffn_gate_exps`` and ``ffn_up_exps``
  [E, d_mlp, d_model] (biases likewise), ``down_proj`` [E, d_mlp, d_model] is stored
  transposed; the sinks are ``attn_sinks.weight``. Not written: the layer pattern (llama.cpp's
  gpt-oss slides on even layers), the yarn ``truncate: false`` and the SwiGLU clamp (7.0) and
  alpha (1.702), which llama.cpp's gpt-oss has built in and the HF config gets here.
- DeepSeek-V2 / V3: MLA's ``kv_b_proj`` [heads * (nope + v), kv_lora_rank] is split per head
  into ``attn_k_b`` [heads, kv_lora_rank, nope] (transposed) and ``attn_v_b`` [heads, v,
  kv_lora_rank]; older files keep one ``attn_kv_b``. The head sizes are
  ``attention.key_length_mla`` / ``value_length_mla`` (older files: ``key_length`` /
  ``value_length``), the yarn softmax factor ``rope.scaling.yarn_log_multiplier`` = 0.1 x
  ``mscale_all_dim`` (``mscale`` taken equal, as llama.cpp does and the published checkpoints
  have). V3 is told from V2 by its sigmoid router (``expert_gating_func`` 2, with the selection
  bias ``exp_probs_b``); V2's group-limited routing by its group count (> 1).
- Llama 4: the stacked ``gate_up_proj`` [E, d_model, 2 d_mlp] (gate the first half) is split
  and transposed into ``ffn_gate_exps`` / ``ffn_up_exps``, ``down_proj`` transposed. Not
  written, built into llama.cpp's llama4 and given to the HF config here: chunked attention
  of 8192 tokens with every fourth layer full and without RoPE, attention temperature tuning
  (floor 8192, scale 0.1), q/k L2 norms except with 128 experts (Maverick); a sliding window
  of 0 means none of these (every layer full, with RoPE).
"""

from __future__ import annotations

from typing import Any

import torch

from mi_core.plugin import UnsupportedModelError

from mi_transformer.gguf.arches import (
    _LLAMA_LAYER, _MOE_SLOTS, GgufArch, Join, _Meta, sliding_layer_types,
)
from mi_transformer.gguf.arches_recent import gating, moe_counts


def _want(t: torch.Tensor, shape: tuple[int, ...], what: str) -> torch.Tensor:
    if tuple(t.shape) != shape:
        raise ValueError(f"{what} must be {list(shape)}")
    return t


def _transposed(family: Any, t: torch.Tensor) -> torch.Tensor:
    """Stacked experts [E, a, b] -> [E, b, a] (llama.cpp stores them nn.Linear-style)."""
    return t.transpose(-1, -2) if t.dim() == 3 else t


# ----------------------------------------------------------------------------------------
# gpt-oss
# ----------------------------------------------------------------------------------------

def _interleaved(family: Any, parts: list[torch.Tensor]) -> torch.Tensor:
    """gate, up [E, d_mlp, d_model] -> gate_up [E, d_model, 2 d_mlp], gate in the even
    columns (biases [E, d_mlp] -> [E, 2 d_mlp]); the inverse of ``GptOssModel``'s
    ``data_torch[:, ::2, :], data_torch[:, 1::2, :]`` after its transpose."""
    moe = family.moe
    gate, up = parts
    if gate.dim() == 2:
        e_f = (moe.num_experts, moe.expert_size)
        _want(gate, e_f, "the gate bias"), _want(up, e_f, "the up bias")
        return torch.stack([gate, up], dim=-1).reshape(moe.num_experts, -1)
    shape = (moe.num_experts, moe.expert_size, family.hidden_size)
    _want(gate, shape, "the gate experts"), _want(up, shape, "the up experts")
    return torch.stack([gate.transpose(1, 2), up.transpose(1, 2)], dim=-1).reshape(
        moe.num_experts, family.hidden_size, 2 * moe.expert_size)


def _gpt_oss(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    c = moe_counts(m)
    cfg.update(num_local_experts=c["experts"], num_experts_per_tok=c["top_k"],
               intermediate_size=c["size"], attention_bias="blk.0.attn_q.bias" in names)
    window = m.int("attention.sliding_window")
    if m.raw(f"{m.arch}.attention.sliding_window_pattern") is not None:
        sliding_layer_types(m, cfg)
    else:  # llama.cpp's gpt-oss: set_swa_pattern(2), the even layers slide
        cfg["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention"
                              for i in range(cfg["num_hidden_layers"])]
        cfg["sliding_window"] = window
    scaling = cfg.get("rope_scaling")
    if scaling is not None and scaling.get("rope_type") == "yarn":
        scaling["truncate"] = False  # gpt-oss's yarn, which llama.cpp's gpt-oss runs


_GPT_OSS_EXPERTS = {
    "ffn_gate_inp": "moe:{block}.{router}",
    "ffn_gate_exps.weight": "join:moe:{block}.experts.gate_up_proj",
    "ffn_up_exps.weight": "join:moe:{block}.experts.gate_up_proj",
    "ffn_gate_exps.bias": "join:moe:{block}.experts.gate_up_proj_bias",
    "ffn_up_exps.bias": "join:moe:{block}.experts.gate_up_proj_bias",
    "ffn_down_exps.weight": "moe:{block}.experts.down_proj",
    "ffn_down_exps.bias": "moe:{block}.experts.down_proj_bias"}


# ----------------------------------------------------------------------------------------
# DeepSeek-V2 / V3
# ----------------------------------------------------------------------------------------

def _kv_b(family: Any, parts: list[torch.Tensor]) -> torch.Tensor:
    """k_b [heads, kv_lora_rank, nope], v_b [heads, v, kv_lora_rank] -> kv_b [heads * (nope +
    v), kv_lora_rank]: the inverse of ``DeepseekV2Model.modify_tensors``'s split."""
    c, h = family.mla, family.num_heads
    k_b = _want(parts[0], (h, c.kv_lora_rank, c.nope_dim), "attn_k_b")
    v_b = _want(parts[1], (h, c.v_head_dim, c.kv_lora_rank), "attn_v_b")
    return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, c.kv_lora_rank)


def _deepseek2(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """MLA sizes, MoE routing, V2 or V3; the yarn softmax factor."""
    v3 = m.int("expert_gating_func", 1) == 2
    gating(m, "sigmoid" if v3 else "softmax")
    heads, rope = cfg["num_attention_heads"], m.int("rope.dimension_count")
    if m.raw(f"{m.arch}.attention.key_length_mla") is not None:
        qk, v = m.int("attention.key_length_mla"), m.int("attention.value_length_mla")
    else:  # converted before llama.cpp's MLA absorption: the per-head sizes themselves
        qk, v = m.int("attention.key_length"), m.int("attention.value_length")
    if qk <= rope:
        raise UnsupportedModelError(f"{m.path}: key length {qk} leaves no dims without "
                                    f"positions beside the {rope} rotary ones")
    c = moe_counts(m)
    groups = m.int("expert_group_count", 1)
    cfg.update(model_type="deepseek_v3" if v3 else "deepseek_v2",
               architectures=["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
               num_key_value_heads=heads, head_dim=rope, qk_rope_head_dim=rope,
               qk_nope_head_dim=qk - rope, v_head_dim=v,
               kv_lora_rank=m.int("attention.kv_lora_rank"),
               q_lora_rank=m.int("attention.q_lora_rank", None),
               n_routed_experts=c["experts"], num_experts_per_tok=c["top_k"],
               moe_intermediate_size=c["size"],
               n_shared_experts=m.int("expert_shared_count", 0, min=0),
               first_k_dense_replace=m.int("leading_dense_block_count", 0, min=0),
               routed_scaling_factor=m.float("expert_weights_scale", 1.0), n_group=groups,
               topk_group=m.int("expert_group_used_count", 1),
               attention_bias="blk.0.attn_kv_a_mqa.bias" in names)
    norm = m.bool("expert_weights_norm", False)
    if v3:
        cfg["norm_topk_prob"] = norm
    else:
        cfg["topk_method"] = "group_limited_greedy" if groups > 1 else "greedy"
        if norm:  # the V2 family never renormalises: refused by its parser, named
            cfg["norm_topk_prob"] = norm
    log_mul = m.float("rope.scaling.yarn_log_multiplier", None)
    scaling = cfg.get("rope_scaling")
    if log_mul is not None and scaling is not None and scaling.get("rope_type") == "yarn":
        scaling["mscale"] = scaling["mscale_all_dim"] = log_mul / 0.1


_MLA_SLOTS = {"attn_q_a": "mla:q_a_proj", "attn_q_a_norm": "mla:q_a_layernorm",
              "attn_q_b": "mla:q_b_proj", "attn_q": "mla:q_proj",
              "attn_kv_a_mqa": "mla:kv_a_proj_with_mqa", "attn_kv_a_norm": "mla:kv_a_layernorm",
              "attn_kv_b": "mla:kv_b_proj",  # one tensor, as older converters wrote it
              "attn_k_b.weight": "join:mla:kv_b_proj.weight",
              "attn_v_b.weight": "join:mla:kv_b_proj.weight", "attn_output": "o"}


# ----------------------------------------------------------------------------------------
# Llama 4
# ----------------------------------------------------------------------------------------

def _concat(family: Any, parts: list[torch.Tensor]) -> torch.Tensor:
    """gate, up [E, d_mlp, d_model] -> gate_up [E, d_model, 2 d_mlp] (gate the first half):
    the inverse of ``Llama4Model.modify_tensors``'s transpose and split."""
    moe = family.moe
    shape = (moe.num_experts, moe.expert_size, family.hidden_size)
    gate = _want(parts[0], shape, "the gate experts")
    up = _want(parts[1], shape, "the up experts")
    return torch.cat([gate, up], dim=1).transpose(1, 2)


def _llama4(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    c = moe_counts(m)
    n = cfg["num_hidden_layers"]
    cfg.update(model_type="llama4_text", intermediate_size=c["size"],
               intermediate_size_mlp=cfg["intermediate_size"], num_local_experts=c["experts"],
               num_experts_per_tok=c["top_k"],
               interleave_moe_layer_step=m.int("interleave_moe_layer_step", 1),
               use_qk_norm=c["experts"] != 128, attention_bias="blk.0.attn_q.bias" in names)
    if m.int("attention.sliding_window", None, min=0) == 0:  # llama.cpp: no chunks, all RoPE
        cfg.update(no_rope_layers=[1] * n, layer_types=["full_attention"] * n,
                   attn_temperature_tuning=False)
    else:
        cfg.update(attention_chunk_size=8192, no_rope_layer_interval=4,
                   attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1)


_LLAMA4_EXPERTS = {
    "ffn_gate_inp": "moe:{block}.{router}",
    "ffn_gate_exps.weight": "join:moe:{block}.experts.gate_up_proj",
    "ffn_up_exps.weight": "join:moe:{block}.experts.gate_up_proj",
    "ffn_down_exps.weight": "moe:{block}.experts.down_proj"}
_SHARED = {k: v for k, v in _MOE_SLOTS.items() if k.endswith("_shexp")}
_ATTN = {k: v for k, v in _LLAMA_LAYER.items() if not k.startswith("ffn_") and k != "attn_norm"}


MOE2_GGUF_ARCHES: dict[str, GgufArch] = {
    "gpt-oss": GgufArch("gpt_oss", "GptOssForCausalLM", {
        **_ATTN, "attn_norm": "ln1", "post_attention_norm": "ln2", "attn_sinks.weight": "sinks",
        **_GPT_OSS_EXPERTS}, configure=_gpt_oss,
        joins={s[5:]: Join(("ffn_gate_exps" + x, "ffn_up_exps" + x), _interleaved)
               for x, s in ((".weight", _GPT_OSS_EXPERTS["ffn_gate_exps.weight"]),
                            (".bias", _GPT_OSS_EXPERTS["ffn_gate_exps.bias"]))},
        convert={"ffn_down_exps.weight": _transposed}),
    "deepseek2": GgufArch("deepseek_v2", "DeepseekV2ForCausalLM", {
        **_MLA_SLOTS, "attn_norm": "ln1", "ffn_norm": "ln2", "ffn_gate": "mlp_in",
        "ffn_up": "mlp_up", "ffn_down": "mlp_out", **_MOE_SLOTS}, configure=_deepseek2,
        joins={"mla:kv_b_proj.weight": Join(("attn_k_b.weight", "attn_v_b.weight"), _kv_b)},
        latent=True),
    "llama4": GgufArch("llama4_text", "Llama4ForCausalLM", {
        **_ATTN, "attn_norm": "ln1", "ffn_norm": "ln2", "ffn_gate": "mlp_in",
        "ffn_up": "mlp_up", "ffn_down": "mlp_out", **_LLAMA4_EXPERTS, **_SHARED},
        configure=_llama4,
        joins={_LLAMA4_EXPERTS["ffn_gate_exps.weight"][5:]: Join(
            ("ffn_gate_exps.weight", "ffn_up_exps.weight"), _concat)},
        convert={"ffn_down_exps.weight": _transposed}),
}
