"""GGUF architectures of the 2025-26 families: ``exaone4``, ``seed_oss``, ``ernie4_5`` (and
OLMo-3, which llama.cpp writes as ``olmo2`` with sliding-window metadata: see
``_olmo2_extra`` in :mod:`~mi_transformer.gguf.arches`).

llama.cpp's converter (``convert_hf_to_gguf.py``: ``Exaone4Model``, ``SeedOssModel``,
``Ernie4_5Model``) writes these with the base ``TextModel`` tensor handling: no row
permutation, names from ``gguf``'s tensor map, llama3 rope factors as ``rope_freqs.weight``
(EXAONE-4), the per-layer sliding pattern as a bool array. GLM-4, GLM-4.5, ERNIE-4.5-MoE,
Hunyuan and Apertus GGUFs stay refused by name: their converters change tensors (partial
rotary, fused gate/up, stacked experts with a selection bias, xIELU parameters as metadata) in
ways not mapped here.
"""

from __future__ import annotations

from typing import Any

from mi_transformer.gguf.arches import _LLAMA_LAYER, GgufArch, _Meta, sliding_layer_types


def _exaone4(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    if sliding_layer_types(m, cfg) is None:
        cfg["sliding_window"] = None


def _seed_oss(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    cfg["attention_out_bias"] = "blk.0.attn_output.bias" in names
    cfg["mlp_bias"] = "blk.0.ffn_up.bias" in names


def _ernie4_5(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg["use_bias"] = "blk.0.attn_q.bias" in names


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
}
