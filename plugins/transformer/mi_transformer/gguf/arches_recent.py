"""GGUF architectures of the 2025-26 families: ``exaone4``, ``seed_oss``, ``ernie4_5`` (and
OLMo-3, which llama.cpp writes as ``olmo2`` with sliding-window metadata: see
``_olmo2_extra`` in :mod:`~mi_transformer.gguf.arches`), ``glm4``, ``glm4moe``,
``ernie4_5-moe``, ``hunyuan-dense``, ``apertus``, and ``smollm3`` and OLMo's ``olmo``.

llama.cpp's converter (``convert_hf_to_gguf.py``: ``Exaone4Model``, ``SeedOssModel``,
``Ernie4_5Model``, ``Glm4Model``, ``Glm4MoeModel``, ``Ernie4_5MoeModel``, ``HunYuanModel``,
``ApertusModel``) writes these with the base ``TextModel`` tensor handling: names from
``gguf``'s tensor map, no row permutation (GLM-4 and ERNIE-4.5 keep their interleaved rotary,
llama.cpp runs it as is), llama3 rope factors as ``rope_freqs.weight`` (EXAONE-4, Apertus), the
per-layer sliding pattern as a bool array, experts stacked [experts, rows, cols] with the
selection bias as ``exp_probs_b.bias``. What else it changes, undone here:

- GLM-4: the fused gate/up MLP stays one ``ffn_up`` [2 d_mlp, d_model]; the rotary width is
  ``rope.dimension_count`` (written always: the family's default fraction is 0.5).
- GLM-4.5: multi-token-prediction layers after the last (``nextn_predict_layers``) are not
  loaded; the MoE routing is metadata (``expert_gating_func`` sigmoid, group counts,
  ``expert_weights_scale`` / ``_norm``, ``leading_dense_block_count``).
- ERNIE-4.5 MoE: its MoE layer schedule is ``leading_dense_block_count`` and
  ``interleave_moe_layer_step`` (to the last layer, as llama.cpp runs it).
- Hunyuan dense: the NTK-alpha RoPE is written as its scaled base (``rope.freq_base`` =
  theta * alpha^(d / (d - 2))), which is what the config gives here.
- Apertus: the xIELU parameters of every layer are metadata arrays (``xielu.alpha_p``,
  ``alpha_n``, ``beta``, ``eps``, the checkpoint's raw values), turned back into tensors.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mi_core.plugin import ConfigError, UnsupportedModelError

from mi_transformer.gguf.arches import (
    _LLAMA_LAYER, _MOE_SLOTS, GgufArch, _Meta, sliding_layer_types, unpermute_qk,
)


def _exaone4(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    if sliding_layer_types(m, cfg) is None:
        cfg["sliding_window"] = None


def _seed_oss(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    cfg["attention_out_bias"] = "blk.0.attn_output.bias" in names
    cfg["mlp_bias"] = "blk.0.ffn_up.bias" in names


def _ernie4_5(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg["use_bias"] = "blk.0.attn_q.bias" in names


def gating(m: _Meta, want: str) -> None:
    """``expert_gating_func`` (1 softmax, 2 sigmoid; absent: the architecture's own) must be
    the router the family has."""
    v = m.int("expert_gating_func", None)
    if v is not None and {1: "softmax", 2: "sigmoid"}.get(v) != want:
        raise UnsupportedModelError(f"{m.path}: GGUF metadata {m.arch}.expert_gating_func = "
                                    f"{v}: this family's router is {want}")


def moe_counts(m: _Meta) -> dict[str, Any]:
    """The MoE sizes every converter writes: experts, experts per token, expert width."""
    return {"experts": m.int("expert_count"), "top_k": m.int("expert_used_count"),
            "size": m.int("expert_feed_forward_length")}


def _rotary_fraction(m: _Meta, cfg: dict[str, Any]) -> None:
    """``partial_rotary_factor`` always (GLM's classes default to 0.5 when it is absent)."""
    if m.raw(f"{m.arch}.rope.dimension_sections") is not None:
        raise UnsupportedModelError(f"{m.path}: GGUF {m.arch} with M-RoPE sections (GLM-4.1V's "
                                    f"vision-language rotary) is not supported")
    cfg["partial_rotary_factor"] = m.int("rope.dimension_count", cfg["head_dim"]) / \
        cfg["head_dim"]


def _glm4(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    _rotary_fraction(m, cfg)
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names


def _glm4_moe(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """GLM-4.5: sigmoid router with a selection bias, groups, routed scaling, shared experts;
    llama.cpp's defaults where the converter wrote nothing (no renormalisation, one group)."""
    _rotary_fraction(m, cfg)
    gating(m, "sigmoid")
    c = moe_counts(m)
    cfg.update(n_routed_experts=c["experts"], num_experts_per_tok=c["top_k"],
               moe_intermediate_size=c["size"],
               n_shared_experts=m.int("expert_shared_count", 0, min=0),
               first_k_dense_replace=m.int("leading_dense_block_count", 0, min=0),
               routed_scaling_factor=m.float("expert_weights_scale", 1.0),
               norm_topk_prob=m.bool("expert_weights_norm", False),
               n_group=m.int("expert_group_count", 1),
               topk_group=m.int("expert_group_used_count", 1),
               num_nextn_predict_layers=m.int("nextn_predict_layers", 0, min=0),
               use_qk_norm="blk.0.attn_q_norm.weight" in names,
               attention_bias="blk.0.attn_q.bias" in names)


def _ernie4_5_moe(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """ERNIE-4.5 MoE: MoE layers every ``interleave_moe_layer_step`` from
    ``leading_dense_block_count`` to the last (llama.cpp has no end index)."""
    gating(m, "softmax")
    c = moe_counts(m)
    cfg.update(moe_num_experts=c["experts"], moe_k=c["top_k"], moe_intermediate_size=c["size"],
               moe_num_shared_experts=m.int("expert_shared_count", 0, min=0),
               moe_layer_start_index=m.int("leading_dense_block_count", 0, min=0),
               moe_layer_interval=m.int("interleave_moe_layer_step", 1),
               use_bias="blk.0.attn_q.bias" in names)


def _hunyuan_dense(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names


def _apertus(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg.update(hidden_act="xielu", attention_bias="blk.0.attn_q.bias" in names)


#: Apertus' xIELU parameters: metadata key -> (slot, the checkpoint's shape)
_XIELU = {"xielu.alpha_p": ("act.alpha_p", (1,)), "xielu.alpha_n": ("act.alpha_n", (1,)),
          "xielu.beta": ("act.beta", ()), "xielu.eps": ("act.eps", ())}


def _xielu_tensors(m: _Meta, family: Any) -> dict[tuple[int | None, str], torch.Tensor]:
    """``xielu.*`` (one float per layer, written by ``ApertusModel.modify_tensors`` from the
    checkpoint's tensors) -> the per-layer tensors of the family's weight table."""
    n = family.num_layers
    out: dict[tuple[int | None, str], torch.Tensor] = {}
    for key, (slot, shape) in _XIELU.items():
        v = m.raw(key)
        if v is None:
            raise ConfigError(f"{m.path}: GGUF metadata lacks required key {key!r} (Apertus' "
                              f"xIELU parameters)")
        if not (isinstance(v, list) and len(v) == n and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                for x in v)):
            raise m._bad(key, v, f"{n} finite numbers (one per layer)")
        for i, x in enumerate(v):
            out[(i, slot)] = torch.tensor(float(x), dtype=torch.float32).reshape(shape)
    return out


def _selection_rows(family: Any, t: torch.Tensor) -> torch.Tensor:
    """ERNIE-4.5's selection bias is stored [1, experts] by the family, [experts] (or as
    published, [1, experts]) by llama.cpp."""
    return t.reshape(1, -1) if t.dim() == 1 else t


def _olmo(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """OLMo: weightless LayerNorms (eps 1e-5, not read), q/k/v clamp."""
    cfg.pop("rms_norm_eps", None)
    cfg.update(clip_qkv=m.float("attention.clamp_kqv", None),
               attention_bias="blk.0.attn_q.bias" in names)


def _smollm3(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """SmolLM3 as llama.cpp runs it: every fourth layer without RoPE
    (``n_no_rope_layer_step = 4``, built in), no sliding window."""
    cfg.update(no_rope_layer_interval=4, use_sliding_window=False,
               attention_bias="blk.0.attn_q.bias" in names,
               mlp_bias="blk.0.ffn_up.bias" in names)


def _unpermute(heads: str) -> Any:
    """``OlmoModel.modify_tensors`` permutes the q / k *weights* only (LlamaModel.permute),
    not their biases: undone for exactly those."""
    def undo(family: Any, w: torch.Tensor) -> torch.Tensor:
        return unpermute_qk(w, getattr(family, heads))
    return undo


_ATTN = {k: v for k, v in _LLAMA_LAYER.items() if not k.startswith("ffn_")}
_QK_NORMS = {"attn_q_norm": "q_norm", "attn_k_norm": "k_norm"}
_DENSE = {"ffn_gate": "mlp_in", "ffn_up": "mlp_up", "ffn_down": "mlp_out"}

RECENT_GGUF_ARCHES: dict[str, GgufArch] = {
    "exaone4": GgufArch("exaone4", "Exaone4ForCausalLM", {
        **{k: v for k, v in _LLAMA_LAYER.items() if not k.endswith("_norm")},
        "attn_q_norm": "q_norm", "attn_k_norm": "k_norm", "post_attention_norm": "ln1_post",
        "post_ffw_norm": "ln2_post"}, configure=_exaone4),
    # Seed-OSS: gguf's tensor map names HF's post_attention_layernorm (the norm before the
    # MLP) post_attention_norm for this architecture
    "seed_oss": GgufArch("seed_oss", "SeedOssForCausalLM", {
        **{k: v for k, v in _LLAMA_LAYER.items() if k != "ffn_norm"},
        "post_attention_norm": "ln2"}, configure=_seed_oss),
    "ernie4_5": GgufArch("ernie4_5", "Ernie4_5ForCausalLM", _LLAMA_LAYER, configure=_ernie4_5),
    # GLM-4-0414: post-norms on the attention and MLP outputs, fused gate/up as ffn_up
    "glm4": GgufArch("glm4", "Glm4ForCausalLM", {
        **_ATTN, "ffn_norm": "ln2", "post_attention_norm": "ln1_post",
        "post_ffw_norm": "ln2_post", "ffn_up": "gate_up", "ffn_down": "mlp_out"},
        configure=_glm4, partial_rotary=True),
    # GLM-4.5: gguf's tensor map names HF's post_attention_layernorm post_attention_norm
    "glm4moe": GgufArch("glm4_moe", "Glm4MoeForCausalLM", {
        **_ATTN, **_QK_NORMS, "post_attention_norm": "ln2", **_DENSE, **_MOE_SLOTS},
        configure=_glm4_moe, partial_rotary=True),
    "ernie4_5-moe": GgufArch("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", {
        **_LLAMA_LAYER, **_MOE_SLOTS}, configure=_ernie4_5_moe,
        convert={"exp_probs_b.bias": _selection_rows}),
    "hunyuan-dense": GgufArch("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", {
        **_LLAMA_LAYER, **_QK_NORMS}, configure=_hunyuan_dense),
    # OLMo (2024): no norm tensors at all; q / k weights permuted as LLaMA's
    "olmo": GgufArch("olmo", "OlmoForCausalLM", {
        k: v for k, v in _LLAMA_LAYER.items() if not k.endswith("_norm")}, configure=_olmo,
        convert={"attn_q.weight": _unpermute("num_heads"),
                 "attn_k.weight": _unpermute("num_kv_heads")}),
    # SmolLM3: a LlamaModel (q / k rows and biases permuted)
    "smollm3": GgufArch("smollm3", "SmolLM3ForCausalLM", _LLAMA_LAYER, permute_qk=True,
                        configure=_smollm3),
    "apertus": GgufArch("apertus", "ApertusForCausalLM", {
        **_ATTN, **_QK_NORMS, "ffn_norm": "ln2", "ffn_up": "mlp_in", "ffn_down": "mlp_out"},
        configure=_apertus, meta_tensors=_xielu_tensors),
}
