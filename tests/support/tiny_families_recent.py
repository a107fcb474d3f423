"""Tiny configs of the 2025-26 families (OLMo-3, EXAONE-4, GLM-4, GLM-4.5, ERNIE-4.5,
Hunyuan dense, Seed-OSS, Apertus), merged into tests.support.tiny_families.FAMILIES.

Each exercises what makes the family different, with the awkward settings published
checkpoints use and bases / fractions / multipliers away from their defaults so that a wrong
one shows: sliding and full layers mixed (window 5, shorter than the 12..24-token prompts),
NoPE full layers, RoPE scaling on full layers only, partial and interleaved rotary, biases,
post-norms, q/k norms after RoPE, NTK-alpha RoPE, the learned xIELU, sigmoid / biased /
group-limited routing with routed scaling and shared experts.
"""

from __future__ import annotations

from typing import Any

_WINDOW = 5
_MIXED = ["sliding_attention", "full_attention", "sliding_attention"]

RECENT_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # yarn on the full layer only; the sliding layers keep their own base
    "olmo3": ("olmo3", {"sliding_window": _WINDOW, "layer_types": _MIXED, "rope_parameters": {
        "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 700.0,
                           "original_max_position_embeddings": 16},
        "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}}}),
    # layer 2 is full attention without RoPE (NoPE); the others slide with RoPE
    "exaone4": ("exaone4", {"head_dim": 16, "sliding_window": _WINDOW, "layer_types": [
        "sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 400.0}}),
    # EXAONE-4.0-1.2B style: no sliding window, RoPE on every layer
    "exaone4_global": ("exaone4", {"head_dim": 16, "sliding_window": None,
                                   "layer_types": ["full_attention"] * 3}),
    "glm": ("glm", {"head_dim": 16, "rope_parameters": {"rope_type": "default",
                                                        "rope_theta": 500.0}}),
    "glm4": ("glm4", {"head_dim": 16, "rope_parameters": {
        "rope_type": "default", "rope_theta": 600.0, "partial_rotary_factor": 0.75}}),
    # 8 experts in 2 groups, 1 group kept; routed scaling 2.5; one shared expert; layer 0 dense
    "glm4_moe": ("glm4_moe", {"head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 3,
                              "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
                              "moe_intermediate_size": 32, "use_qk_norm": True,
                              "attention_bias": True, "first_k_dense_replace": 1}),
    "ernie4_5": ("ernie4_5", {"head_dim": 16, "use_bias": True,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 600.0}}),
    # layers 1 and 2 MoE (start index 1), one shared expert
    "ernie4_5_moe": ("ernie4_5_moe", {"head_dim": 16, "moe_num_experts": 4, "moe_k": 2,
                                      "moe_intermediate_size": 32, "moe_num_shared_experts": 1,
                                      "tie_word_embeddings": False}),
    # NTK-alpha RoPE: base 1000 * 50^(16/14)
    "hunyuan_v1_dense": ("hunyuan_v1_dense", {"head_dim": 16, "rope_parameters": {
        "rope_type": "dynamic", "alpha": 50.0, "rope_theta": 1000.0, "factor": 1.0}}),
    "seed_oss": ("seed_oss", {"head_dim": 16, "attention_bias": True, "attention_out_bias": True,
                              "mlp_bias": True}),
    "apertus": ("apertus", {"head_dim": 16, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
}
