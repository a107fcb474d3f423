"""The registry of supported families: ``model_type`` -> :class:`Family` (its parser, the
config keys it reads, the ones known to be harmless and the neutral values of keys it does
not read). The key tables of docs/BACKENDS.md are generated from it
(:mod:`mi_transformer.keytable`)."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import attrs

from mi_transformer.config.axes import TransformerConfig
from mi_transformer.config.families_gpt import (
    parse_falcon, parse_gpt2, parse_gpt_neox, parse_gptj, parse_opt, parse_phi, parse_stablelm,
)
from mi_transformer.config.families_gemma import GEMMA_FAMILIES
from mi_transformer.config.families_hybrid import (
    BAMBA_READS, GRANITEMOEHYBRID_HARMLESS, GRANITEMOEHYBRID_NEUTRAL, GRANITEMOEHYBRID_READS,
    HYBRID_HARMLESS, JAMBA_READS, NEMOTRON_H_HARMLESS, NEMOTRON_H_NEUTRAL,
    NEMOTRON_H_READS, parse_bamba, parse_granitemoehybrid, parse_jamba, parse_nemotron_h,
)
from mi_transformer.config.families_hybrid2 import HYBRID2_FAMILIES
from mi_transformer.config.families_llama import (
    _GEMMA3_MM_KEYS, _GEMMA_HARMLESS, parse_cohere, parse_gemma, parse_gemma2, parse_gemma3,
    parse_gemma3_text, parse_granite, parse_helium, parse_llama, parse_mistral, parse_olmo,
    parse_olmo2, parse_phi3, parse_qwen2, parse_qwen3, parse_smollm3, parse_starcoder2,
)
from mi_transformer.config.families_linear import (
    OLMO_HYBRID_HARMLESS, OLMO_HYBRID_READS, QWEN3_5_HARMLESS, QWEN3_5_MM_KEYS,
    QWEN3_5_MOE_HARMLESS, QWEN3_5_MOE_NEUTRAL, QWEN3_5_MOE_TEXT_READS, QWEN3_5_NEUTRAL,
    QWEN3_5_TEXT_READS, QWEN3_NEXT_READS, parse_olmo_hybrid, parse_qwen3_5, parse_qwen3_5_moe,
    parse_qwen3_5_moe_text, parse_qwen3_5_text, parse_qwen3_next,
)
from mi_transformer.config.families_minimax import (MINIMAX_HARMLESS, MINIMAX_NEUTRAL,
                                                    MINIMAX_READS, parse_minimax)
from mi_transformer.config.families_zamba2 import (ZAMBA2_HARMLESS, ZAMBA2_NEUTRAL,
                                                   ZAMBA2_READS, parse_zamba2)
from mi_transformer.config.families_moe import (
    parse_mixtral, parse_olmoe, parse_qwen2_moe, parse_qwen3_moe,
)
from mi_transformer.config.families_moe2 import MOE2_FAMILIES, NEUTRAL as _MOE2_NEUTRAL
from mi_transformer.config.families_recent import RECENT_FAMILIES
from mi_transformer.config.families_tl import (MODEL_TYPE as _TL_MODEL_TYPE,
                                                READS as _TL_READS,
                                                parse_mi_tl_hooked_transformer)
from mi_transformer.config.families_ssm import (
    FALCON_MAMBA_READS, MAMBA2_HARMLESS, MAMBA2_NEUTRAL, MAMBA2_READS, MAMBA_NEUTRAL,
    MAMBA_READS, SSM_HARMLESS, parse_falcon_mamba,
    parse_mamba, parse_mamba2,
)
from mi_transformer.config.neutral import (KV_HEADS, MLP_WIDTH, NORM_EPS, ROTARY, ROTARY_DIM,
                                           SHARED_KEYS,
                                           ROTARY_INTERLEAVED, VOCAB)
from mi_transformer.config.reader import ConfigReader


@attrs.frozen
class Family:
    """One supported ``model_type``.

    `reads`: every config key the parser looks at (implemented, or refused for values it
    cannot honour). `harmless`: family keys known not to change the numbers, whatever their
    value. `neutral`: keys the parser does not read, each with the one value that leaves the
    forward unchanged (a constant, or a :class:`~mi_transformer.config.neutral.Derived` of the
    parsed config); another value is a ``ConfigError`` naming key, value and neutral value.
    Any other non-null key (beyond :func:`mi_core.configread.is_generic_harmless`) makes the
    config an ``UnknownKeysError`` (:mod:`mi_transformer.config.neutral` gives the order).
    """

    model_type: str
    parse: Callable[[ConfigReader], TransformerConfig]
    reads: frozenset[str]
    harmless: frozenset[str] = frozenset()
    note: str = ""
    neutral: Mapping[str, Any] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        # the rotary tables' shared keys give way to a parser that reads the key itself
        object.__setattr__(self, "neutral", {k: v for k, v in self.neutral.items()
                                             if k not in SHARED_KEYS or k not in self.reads})


_SHAPE_KEYS = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size",
               "max_position_embeddings", "hidden_act", "tie_word_embeddings"}
_ROPE = {"rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
         "original_max_position_embeddings"}  # the last: yarn / longrope at the top level
_LLAMA = _SHAPE_KEYS | _ROPE | {"rms_norm_eps", "attention_bias", "mlp_bias",
                                "use_bidirectional_attention"}


def _family(model_type: str, parse: Callable[[ConfigReader], TransformerConfig],
            reads: Iterable[str], harmless: Iterable[str] = (), note: str = "", *,
            neutral: Mapping[str, Any] | None = None) -> Family:
    """`neutral` None: the rotate-half families' shared table (:data:`ROTARY`); give
    :data:`ROTARY_INTERLEAVED` for a GPT-J rotary layout, ``{}`` for learned positions."""
    return Family(model_type, parse, frozenset(reads), frozenset(harmless), note,
                  dict(ROTARY if neutral is None else neutral))


#: Keys known not to change the numbers, shared by several families.
_GPT2_HARMLESS = {"n_special", "predict_special_tokens",  # GPT-1 leftovers, never read
                  "summary_type", "summary_use_proj", "summary_activation",
                  "summary_proj_to_labels", "summary_first_dropout"}
_MOE_HARMLESS = {"output_router_logits", "router_aux_loss_coef", "router_jitter_noise"}
_QWEN_WINDOWS = {"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"}
#: Qwen2.5 configs say use_mrope: false (multimodal rotary sections; text-only Qwen never
#: reads it)
_QWEN_NEUTRAL = {**ROTARY, "use_mrope": False}
#: Qwen3-Coder-480B-A35B's config.json names what transformers' Qwen3-MoE always does (q/k
#: norms, no q/k/v bias, no shared expert) under keys it never reads
_QWEN3_MOE_NEUTRAL = {**_QWEN_NEUTRAL, "use_qk_norm": True, "qkv_bias": False,
                      "shared_expert_intermediate_size": 0}
#: Phi-4-mini's config.json carries its remote code's switches, which transformers' Phi-3
#: never reads; at these values that code is transformers' forward (every layer full
#: attention, positions not interpolated, no lm_head bias)
_PHI3_NEUTRAL = {**ROTARY, "full_attn_mod": 1, "interpolate_factor": 1, "lm_head_bias": False}
#: Hunyuan's configs repeat the vocabulary size as org_vocab_size (never read by
#: transformers' HunYuan dense)
_RECENT_NEUTRAL = {"hunyuan_v1_dense": {"org_vocab_size": VOCAB},
                   # EXAONE-4.5's text_config: q/k normed right after the projections (its
                   # "QK-reorder" norm), what transformers' Exaone4 always does
                   "exaone4": {"reorder_qk_norm": True}}


#: model_type -> Family. A new family is one entry here plus a weight-name table
#: (mi_transformer.weights.NAME_TABLES); see docs/BACKENDS.md.
FAMILIES: dict[str, Family] = {f.model_type: f for f in [
    _family("llama", parse_llama, _LLAMA),
    _family("helium", parse_helium, _LLAMA, note="interleaved (GPT-J) rotary layout",
            neutral=ROTARY_INTERLEAVED),
    _family("mistral", parse_mistral, _LLAMA | {"sliding_window"}),
    _family("qwen2", parse_qwen2, _LLAMA | {"sliding_window", "use_sliding_window",
                                            "max_window_layers", "layer_types"},
            neutral=_QWEN_NEUTRAL),
    _family("qwen3", parse_qwen3, _LLAMA | {"sliding_window", "use_sliding_window",
                                            "max_window_layers", "layer_types"},
            neutral=_QWEN_NEUTRAL),
    _family("gemma", parse_gemma, _LLAMA | {"hidden_activation"}),
    _family("gemma2", parse_gemma2, _LLAMA | {
        "hidden_activation", "attn_logit_softcapping", "final_logit_softcapping",
        "query_pre_attn_scalar", "sliding_window", "sliding_window_size", "layer_types"},
        harmless=_GEMMA_HARMLESS),
    _family("gemma3_text", parse_gemma3_text, _LLAMA | {
        "hidden_activation", "attn_logit_softcapping", "final_logit_softcapping",
        "query_pre_attn_scalar", "sliding_window", "layer_types", "sliding_window_pattern",
        "_sliding_window_pattern", "rope_local_base_freq"},
        harmless=_GEMMA_HARMLESS),
    _family("phi3", parse_phi3, _LLAMA | {"sliding_window", "original_max_position_embeddings"},
            neutral=_PHI3_NEUTRAL),
    _family("cohere", parse_cohere, _LLAMA | {"layer_norm_eps", "use_qk_norm", "logit_scale"},
            note="parallel block, one shared LayerNorm, interleaved rotary",
            neutral=ROTARY_INTERLEAVED,
            harmless={"model_max_length"}),  # Command R's config.json: a tokenizer setting
    _family("gemma3", parse_gemma3, {"text_config", "tie_word_embeddings", *_GEMMA3_MM_KEYS},
            note="multimodal checkpoint: the language model only"),
    _family("olmo", parse_olmo, _LLAMA | {"clip_qkv"},
            note="non-parametric LayerNorm, clip_qkv"),
    _family("olmo2", parse_olmo2, _LLAMA, note="post-norms only, full-width q/k norms"),
    _family("granite", parse_granite, _LLAMA | {
        "embedding_multiplier", "residual_multiplier", "attention_multiplier",
        "logits_scaling"}),
    _family("smollm3", parse_smollm3, _LLAMA | {
        "no_rope_layers", "no_rope_layer_interval", "use_sliding_window", "sliding_window",
        "layer_types"}, note="NoPE layers",
        # transformers 4.54 wrote it; transformers 5's SmolLM3 reads no such key
        harmless={"max_window_layers"}),
    _family("mixtral", parse_mixtral, _LLAMA | {"sliding_window", "num_local_experts",
                                                "num_experts_per_tok"}, harmless=_MOE_HARMLESS),
    _family("qwen2_moe", parse_qwen2_moe, _LLAMA | _QWEN_WINDOWS | {
        "qkv_bias", "num_experts", "num_local_experts", "num_experts_per_tok",
        "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob",
        "decoder_sparse_step", "mlp_only_layers"}, harmless=_MOE_HARMLESS,
        neutral=_QWEN_NEUTRAL),
    _family("qwen3_moe", parse_qwen3_moe, _LLAMA | _QWEN_WINDOWS | {
        "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
        "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"}, harmless=_MOE_HARMLESS,
        neutral=_QWEN3_MOE_NEUTRAL),
    _family("olmoe", parse_olmoe, _LLAMA | {"num_experts", "num_local_experts",
                                            "num_experts_per_tok", "norm_topk_prob",
                                            "clip_qkv"}, harmless=_MOE_HARMLESS),
    _family("gpt2", parse_gpt2, {
        "vocab_size", "n_embd", "n_head", "n_layer", "n_inner", "n_positions", "n_ctx",
        "layer_norm_epsilon", "activation_function", "tie_word_embeddings",
        "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"},
        harmless=_GPT2_HARMLESS, note="learned positions, Conv1D fused QKV",
        # transformers' GGUF conversion writes llama.cpp's feed_forward_length, which its
        # GPT-2 never reads (its MLP is n_inner, or 4 x n_embd)
        neutral={"feed_forward_length": MLP_WIDTH}),
    _family("gpt_neox", parse_gpt_neox, _SHAPE_KEYS | _ROPE | {
        "layer_norm_eps", "attention_bias", "use_parallel_residual", "rotary_pct",
        "rotary_emb_base"}, note="per-head fused QKV, partial rotary, parallel or sequential"),
    _family("gptj", parse_gptj, {"rotary", "scale_attn_weights",
        "vocab_size", "n_embd", "n_head", "n_layer", "n_inner", "n_positions", "rotary_dim",
        "layer_norm_epsilon", "activation_function", "tie_word_embeddings"},
        harmless=_GPT2_HARMLESS, note="parallel, one norm, interleaved partial rotary",
        neutral=ROTARY_INTERLEAVED),
    _family("phi", parse_phi, _SHAPE_KEYS | _ROPE | {"layer_norm_eps", "qk_layernorm"},
            note="parallel, one norm, partial rotary",
            # phi-1's config.json: its projections always carry biases (transformers' Phi
            # reads no attention_bias), and rotary_dim repeats partial_rotary_factor
            neutral={**ROTARY, "attention_bias": False, "rotary_dim": ROTARY_DIM}),
    _family("stablelm", parse_stablelm, _SHAPE_KEYS | _ROPE | {
        "layer_norm_eps", "qk_layernorm", "use_parallel_residual", "use_qkv_bias"},
        note="LayerNorm, partial rotary, sequential or parallel (one norm)"),
    _family("opt", parse_opt, {
        "vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "ffn_dim",
        "max_position_embeddings", "activation_function",
        "tie_word_embeddings", "do_layer_norm_before", "_remove_final_layer_norm",
        "layer_norm_elementwise_affine", "word_embed_proj_dim", "enable_bias"},
        note="learned positions (offset 2), ReLU; LayerNorm eps fixed at 1e-5", neutral={}),
    _family("falcon", parse_falcon, _ROPE | {"apply_residual_connection_post_layernorm",
        "vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "num_kv_heads",
        "ffn_hidden_size", "layer_norm_epsilon", "activation", "tie_word_embeddings", "alibi",
        "new_decoder_architecture", "multi_query", "parallel_attn", "num_ln_in_parallel_attn",
        "bias", "max_position_embeddings"},
        note="multi-query / grouped (new decoder) / per-head fused QKV",
        # transformers' GGUF conversion writes LLaMA's names, which its Falcon never reads
        neutral={**ROTARY, "intermediate_size": MLP_WIDTH, "num_key_value_heads": KV_HEADS}),
    _family("starcoder2", parse_starcoder2, _LLAMA | {"sliding_window", "norm_epsilon",
                                                      "use_bias"},
            # StarCoder2's config.json names its (only) MLP and norm kinds; the 7B / 15B ones
            # keep GPTBigCode's keys: the eps again, the fp32 softmax and 1/sqrt(head_dim)
            # scaling transformers' Starcoder2 always does, and an activation_function it
            # never reads (hidden_act decides: the 7B says "gelu" beside gelu_pytorch_tanh)
            neutral={**ROTARY, "mlp_type": "default", "norm_type": "layer_norm",
                     "layer_norm_epsilon": NORM_EPS, "attention_softmax_in_fp32": True,
                     "scale_attention_softmax_in_fp32": True, "scale_attn_weights": True},
            harmless={"activation_function"}),
    # state-space families: the layers run a plugin's mixer (mi-ssm), not attention; no
    # positions, so no rotary key is neutral
    # (transformers' GGUF conversion writes llama.cpp's context_length as
    # max_position_embeddings: no positions, so no value of it changes Mamba's numbers)
    _family("mamba", parse_mamba, MAMBA_READS,
            harmless=SSM_HARMLESS | {"max_position_embeddings"},
            note="Mamba-1 mixer (mi-ssm), no MLP", neutral=MAMBA_NEUTRAL),
    _family("falcon_mamba", parse_falcon_mamba, FALCON_MAMBA_READS, harmless=SSM_HARMLESS,
            note="Mamba-1 mixer with B/C/dt RMS norms (mi-ssm), no MLP",
            neutral=MAMBA_NEUTRAL),
    _family("mamba2", parse_mamba2, MAMBA2_READS, harmless=SSM_HARMLESS | MAMBA2_HARMLESS,
            note="Mamba-2 mixer (mi-ssm), no MLP", neutral=MAMBA2_NEUTRAL),
    # hybrids: a schedule of state-space mixers (mi-ssm) and attention, each with an MLP
    _family("jamba", parse_jamba, JAMBA_READS, harmless=HYBRID_HARMLESS | SSM_HARMLESS,
            note="Mamba-1 (gained dt/B/C norms) + attention without positions, MoE",
            neutral={}),
    _family("bamba", parse_bamba, BAMBA_READS, harmless=HYBRID_HARMLESS | SSM_HARMLESS,
            note="Mamba-2 + attention with half-rotary RoPE, MLP after each",
            # Bamba-9B's attn_rotary_emb: the rotary width (transformers hard-codes half
            # the head and never reads the key)
            neutral={**ROTARY, "attn_rotary_emb": ROTARY_DIM}),
    _family("granitemoehybrid", parse_granitemoehybrid, GRANITEMOEHYBRID_READS,
            harmless=HYBRID_HARMLESS | SSM_HARMLESS | GRANITEMOEHYBRID_HARMLESS,
            note="Granite 4.0-H: Mamba-2 + attention (RoPE or none), MoE + shared MLP, "
                 "Granite multipliers",
            neutral={**ROTARY, **GRANITEMOEHYBRID_NEUTRAL}),
    _family("nemotron_h", parse_nemotron_h, NEMOTRON_H_READS,
            harmless=HYBRID_HARMLESS | SSM_HARMLESS | NEMOTRON_H_HARMLESS,
            note="Mamba-2 / attention / relu2 MLP / mixture-of-experts layers",
            neutral=NEMOTRON_H_NEUTRAL),
    # linear-attention hybrids: gated DeltaNet layers (mi-ssm) and gated attention layers
    _family("qwen3_next", parse_qwen3_next, _LLAMA | QWEN3_NEXT_READS, harmless=_MOE_HARMLESS,
            note="gated DeltaNet (mi-ssm) + gated attention, MoE with a shared expert"),
    _family("qwen3_5_text", parse_qwen3_5_text, _LLAMA | QWEN3_5_TEXT_READS,
            harmless=QWEN3_5_HARMLESS, neutral=QWEN3_5_NEUTRAL,
            note="gated DeltaNet (mi-ssm) + gated attention, dense MLP"),
    _family("qwen3_5_moe_text", parse_qwen3_5_moe_text, _LLAMA | QWEN3_5_MOE_TEXT_READS,
            harmless=QWEN3_5_MOE_HARMLESS, neutral=QWEN3_5_MOE_NEUTRAL,
            note="gated DeltaNet (mi-ssm) + gated attention, MoE with a shared expert"),
    _family("qwen3_5", parse_qwen3_5, {"text_config", "tie_word_embeddings", *QWEN3_5_MM_KEYS},
            note="multimodal checkpoint: the language model (qwen3_5_text) only"),
    _family("qwen3_5_moe", parse_qwen3_5_moe,
            {"text_config", "tie_word_embeddings", *QWEN3_5_MM_KEYS},
            note="multimodal checkpoint: the language model (qwen3_5_moe_text) only"),
    _family("olmo_hybrid", parse_olmo_hybrid, _LLAMA | OLMO_HYBRID_READS,
            harmless=OLMO_HYBRID_HARMLESS,
            note="gated DeltaNet (mi-ssm, pre-norm) + OLMo2 attention (post-norm)"),
]}


#: The recent families with GPT-J (interleaved) rotary; the rest rotate halves.
_RECENT_INTERLEAVED = {"glm", "glm4", "ernie4_5", "ernie4_5_moe"}
FAMILIES.update({mt: _family(mt, parse, _LLAMA | reads, harmless, note, neutral={
    **(ROTARY_INTERLEAVED if mt in _RECENT_INTERLEAVED else ROTARY),
    **_RECENT_NEUTRAL.get(mt, {})})
                 for mt, parse, reads, harmless, note in RECENT_FAMILIES})
# gpt-oss, DeepSeek-V2/V3, Llama 4 (config/families_moe2.py): their key sets are whole;
# DeepSeek and Llama 4 rotate interleaved pairs, gpt-oss halves
_MOE2_INTERLEAVED = {"deepseek_v2", "deepseek_v3", "llama4_text", "llama4"}
FAMILIES.update({mt: _family(mt, parse, reads, harmless, note, neutral={
    **(ROTARY_INTERLEAVED if mt in _MOE2_INTERLEAVED else ROTARY), **_MOE2_NEUTRAL.get(mt, {})})
    for mt, parse, reads, harmless, note in MOE2_FAMILIES})

# issue 23, part 2: MiniMax (lightning attention, config/families_minimax.py) and Zamba2
# (a shared attention block reused across Mamba-2 layers, config/families_zamba2.py)
FAMILIES.update({f.model_type: f for f in [
    _family("zamba2", parse_zamba2, ZAMBA2_READS, harmless=ZAMBA2_HARMLESS,
            note="Mamba-2 (mi-ssm); shared attention + MLP blocks with per-use LoRA adapters, "
                 "on the residual and the embeddings, before some layers' mixers",
            neutral={**ROTARY, **ZAMBA2_NEUTRAL}),
    _family("minimax", parse_minimax, _SHAPE_KEYS | _ROPE | MINIMAX_READS | {
        "rms_norm_eps", "use_bidirectional_attention"}, harmless=MINIMAX_HARMLESS,
        note="lightning attention (mi-ssm) + attention, MoE; residual = alpha * norm output",
        neutral={**ROTARY, **MINIMAX_NEUTRAL}),
]})


# Gemma-4, Gemma-3n (config/families_gemma.py): key sets whole, rotate-half rotary
FAMILIES.update({mt: _family(mt, parse, reads, harmless, note)
                 for mt, parse, reads, harmless, note in GEMMA_FAMILIES})


# Falcon-H1 (attention beside Mamba-2), LFM2 (short convolution): config/families_hybrid2.py
FAMILIES.update({mt: _family(mt, parse, reads, harmless, note, neutral={**ROTARY, **neutral})
                 for mt, parse, reads, harmless, note, neutral in HYBRID2_FAMILIES})


# mi_core.tl's HookedTransformer(cfg): the plugin-internal checkpoint tl_config.py writes
# (TransformerLens' own config fields; config/families_tl.py), no published model_type
FAMILIES[_TL_MODEL_TYPE] = _family(
    _TL_MODEL_TYPE, parse_mi_tl_hooked_transformer, _TL_READS, neutral={},
    note="plugin-internal: HookedTransformer(cfg)'s checkpoint, TransformerLens' fields")


def family_parsers() -> dict[str, Callable[[ConfigReader], TransformerConfig]]:
    return {k: f.parse for k, f in FAMILIES.items()}


#: Backwards-compatible view: model_type -> parser.
FAMILY_PARSERS = family_parsers()
