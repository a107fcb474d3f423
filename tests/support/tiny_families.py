"""Tiny test model families (configs only); conftest.py builds and caches the checkpoints.

A module of its own (not conftest) so that tests can import the names for parametrisation.
"""

from __future__ import annotations

from typing import Any

HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, D_MLP = 64, 3, 4, 2, 128, 96
WINDOW = 5  # sliding window shorter than the test prompts (seq 12..24)

_COMMON: dict[str, Any] = dict(hidden_size=HIDDEN, intermediate_size=D_MLP, num_hidden_layers=LAYERS,
                               num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                               vocab_size=VOCAB, max_position_embeddings=64,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2)

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

# LongRoPE factors, one per rotated frequency (head_dim 16 -> 8)
_SHORT = [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5]
_LONG = [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0]

#: name -> (model_type, config overrides). Every family of issue 3, with the variants it names.
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama3_rope": ("llama", {"rope_scaling": _LLAMA3_ROPE, "rope_theta": 10000.0}),
    "llama_linear_rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    # max_position_embeddings 12 < the 16-token prompts: the NTK base really grows
    "llama_dynamic_rope": ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
                                     "max_position_embeddings": 12}),
    "qwen2_untied": ("qwen2", {"tie_word_embeddings": False}),
    "qwen2_tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "gemma": ("gemma", {"head_dim": 16}),
    "gemma2": ("gemma2", {"head_dim": 16, "sliding_window": WINDOW, "query_pre_attn_scalar": 8,
                          "attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0}),
    "gemma3_text": ("gemma3_text", {"head_dim": 16, "sliding_window": WINDOW,
                                    "query_pre_attn_scalar": 8,
                                    "layer_types": ["sliding_attention", "full_attention",
                                                    "sliding_attention"]}),
    "phi3": ("phi3", {}),
    "starcoder2": ("starcoder2", {}),
    "mistral": ("mistral", {"sliding_window": WINDOW}),
    # RoPE scaling: the test prompts (16 tokens) pass original_max_position_embeddings, so the
    # long factors / yarn interpolation really apply; factors far from 1 so a wrong one shows.
    "phi3_longrope": ("phi3", {"original_max_position_embeddings": 8,
                               "rope_scaling": {"type": "longrope",
                                                "short_factor": _SHORT, "long_factor": _LONG}}),
    "qwen2_yarn": ("qwen2", {"rope_scaling": {"type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 16}}),
    # Mixture of experts: Mixtral always renormalises the top-k weights; Qwen2-MoE (shared
    # expert with its sigmoid gate; layer 1 dense via mlp_only_layers) and OLMoE (full-width
    # q/k norms, clip_qkv that really clips) do not; Qwen3-MoE does (norm_topk_prob).
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": ("qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 32,
                                "shared_expert_intermediate_size": 48, "mlp_only_layers": [1]}),
    "qwen3_moe": ("qwen3_moe", {"head_dim": 16, "num_experts": 8, "num_experts_per_tok": 3,
                                "moe_intermediate_size": 32, "norm_topk_prob": True}),
    "olmoe": ("olmoe", {"num_experts": 4, "num_experts_per_tok": 2, "clip_qkv": 1.0}),
    # LLaMA-like with twists; multipliers and bases far from their defaults so a wrong one shows
    "olmo": ("olmo", {"clip_qkv": 0.5, "rope_theta": 300.0}),
    "olmo2": ("olmo2", {"rope_theta": 500.0}),
    "granite": ("granite", {"embedding_multiplier": 3.0, "residual_multiplier": 0.4,
                            "attention_multiplier": 0.3, "logits_scaling": 2.5}),
    # layer 1 without positions; the sliding window applies to NoPE layers only
    "smollm3": ("smollm3", {"no_rope_layers": [1, 0, 1], "use_sliding_window": True,
                            "sliding_window": WINDOW, "rope_theta": 700.0}),
    "smollm3_interval": ("smollm3", {"no_rope_layers": None, "no_rope_layer_interval": 2}),
    "cohere": ("cohere", {"logit_scale": 0.3, "rope_theta": 400.0}),
    "cohere_qk_norm": ("cohere", {"logit_scale": 0.3, "rope_theta": 400.0, "use_qk_norm": True}),
}

# GPT-style families spell the sizes their own way (GPT-2's n_embd, OPT's ffn_dim, ...): their
# entries give the whole config (no _COMMON). Bases and fractions away from the defaults so a
# wrong one shows; every variant the issue names (NeoX parallel/sequential, Falcon 7B-style
# multi-query / new decoder / sequential, StableLM sequential/parallel).
_GPT2 = dict(n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS, n_positions=64, n_inner=D_MLP,
             vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)
_SIZES = dict(hidden_size=HIDDEN, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
              vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
_NEOX = dict(_SIZES, intermediate_size=D_MLP,
             rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                              "partial_rotary_factor": 0.5})
_FALCON = dict(_SIZES, ffn_hidden_size=D_MLP, rope_parameters={"rope_type": "default",
                                                                 "rope_theta": 700.0})
_STABLELM = dict(_SIZES, intermediate_size=D_MLP, num_key_value_heads=KV_HEADS,
                 use_qkv_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 900.0,
                                                     "partial_rotary_factor": 0.25})
GPT_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("gpt2", _GPT2),
    "gpt2_layer_scaled": ("gpt2", dict(_GPT2, scale_attn_by_inverse_layer_idx=True)),
    "gpt_neox": ("gpt_neox", dict(_NEOX, use_parallel_residual=True)),
    "gpt_neox_sequential": ("gpt_neox", dict(_NEOX, use_parallel_residual=False)),
    "gptj": ("gptj", dict(_GPT2, rotary_dim=8)),
    "phi": ("phi", dict(_SIZES, intermediate_size=D_MLP, num_key_value_heads=KV_HEADS,
                        rope_parameters={"rope_type": "default", "rope_theta": 300.0,
                                         "partial_rotary_factor": 0.5})),
    "opt": ("opt", dict(_SIZES, ffn_dim=D_MLP, word_embed_proj_dim=HIDDEN)),
    "falcon_7b": ("falcon", dict(_FALCON, multi_query=True, parallel_attn=True)),
    "falcon_new_decoder": ("falcon", dict(_FALCON, new_decoder_architecture=True,
                                          num_kv_heads=KV_HEADS)),
    "falcon_sequential": ("falcon", dict(_FALCON, multi_query=False, parallel_attn=False,
                                         bias=True)),
    "stablelm": ("stablelm", _STABLELM),
    "stablelm_parallel": ("stablelm", dict(_STABLELM, use_parallel_residual=True)),
    "stablelm_qk_norm": ("stablelm", dict(_STABLELM, qk_layernorm=True)),
}
FAMILIES.update(GPT_FAMILIES)
FAMILIES["helium"] = ("helium", {"head_dim": 16})


# the 2025-26 families (issue 21)
from tests.support.tiny_families_recent import RECENT_FAMILIES  # noqa: E402

FAMILIES.update(RECENT_FAMILIES)
