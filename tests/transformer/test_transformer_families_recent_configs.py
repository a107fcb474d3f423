"""Configs of the 2025-26 families as their checkpoints publish them, the routers of the
MoE ones, and the families refused by name.

Published-style configs: the key sets and spellings of the hub's config.json files of
OLMo-3-7B, EXAONE-4.0-32B, GLM-4-9B-0414, GLM-4.5-Air, ERNIE-4.5-0.3B, ERNIE-4.5-21B-A3B,
Hunyuan-7B, Seed-OSS-36B and Apertus-8B (``rope_theta`` / ``rope_scaling``, MTP layer counts,
flags of the original code), written out here. The reference for what they mean is
transformers' own config class reading the same dict (``AutoConfig.for_model``).
Routers: our routing (weights and chosen experts) against transformers' router module fed
with the same MLP input, < 1e-5 / exactly equal.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, UnsupportedModelError
from mi_transformer.config import parse_config

_L4 = ["sliding_attention"] * 3 + ["full_attention"]

PUBLISHED: dict[str, dict] = {
    "olmo3": {
        "architectures": ["Olmo3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 11008, "layer_types": _L4 * 8,
        "max_position_embeddings": 65536, "model_type": "olmo3", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "pad_token_id": 100277,
        "rms_norm_eps": 1e-06, "rope_scaling": {
            "attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1,
            "factor": 8.0, "original_max_position_embeddings": 8192, "rope_type": "yarn"},
        "rope_theta": 500000, "sliding_window": 4096, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.57.0", "use_cache": True,
        "vocab_size": 100278},
    "exaone4": {
        "architectures": ["Exaone4ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 361, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
        "initializer_range": 0.02, "intermediate_size": 27392, "layer_types": _L4 * 16,
        "max_position_embeddings": 131072, "model_type": "exaone4", "num_attention_heads": 40,
        "num_hidden_layers": 64, "num_key_value_heads": 8, "pad_token_id": 0,
        "rms_norm_eps": 1e-05, "rope_scaling": {
            "factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 1000000, "sliding_window": 4096, "sliding_window_pattern": "LLLG",
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 102400},
    "glm4": {
        "architectures": ["Glm4ForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 13696,
        "max_position_embeddings": 32768, "model_type": "glm4", "num_attention_heads": 32,
        "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
        "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 151552},
    "glm4_moe": {
        "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True,
        "attention_dropout": 0.0, "pad_token_id": 151329,
        "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 4096, "partial_rotary_factor": 0.5, "initializer_range": 0.02,
        "intermediate_size": 10944, "max_position_embeddings": 131072,
        "model_type": "glm4_moe", "moe_intermediate_size": 1408, "norm_topk_prob": True,
        "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
        "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
        "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
        "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "use_qk_norm": False, "vocab_size": 151552},
    "ernie4_5": {
        "architectures": ["Ernie4_5ForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
        "max_position_embeddings": 131072, "model_type": "ernie4_5", "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 18,
        "pad_token_id": 0, "rms_norm_eps": 1e-05, "use_cache": False, "vocab_size": 103424,
        "rope_theta": 500000, "use_bias": False, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"},
    "ernie4_5_moe": {
        "architectures": ["Ernie4_5_MoeForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 12288,
        "max_position_embeddings": 131072, "model_type": "ernie4_5_moe",
        "num_attention_heads": 20, "num_key_value_heads": 4, "num_hidden_layers": 28,
        "pad_token_id": 0, "rms_norm_eps": 1e-05, "use_cache": False, "vocab_size": 103424,
        "rope_theta": 500000, "use_bias": False, "moe_num_experts": 64,
        "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
        "moe_intermediate_size": 1536, "moe_capacity": [64, 64, 64], "moe_gate": "topk",
        "moe_k": 6, "moe_layer_interval": 1, "moe_use_aux_free": True,
        "num_nextn_predict_layers": 1, "multi_token_pred_lambda": 0.3,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
    "hunyuan_v1_dense": {
        "architectures": ["HunYuanDenseV1ForCausalLM"], "add_classification_head": False,
        "attention_bias": False, "attention_dropout": 0.0, "attention_head_dim": 128,
        "bos_token_id": 1, "cla_share_factor": 2, "eod_token_id": 127967,
        "eos_token_id": 127960, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336, "kv_lora_rank": None,
        "max_position_embeddings": 32768, "mlp_bias": False, "model_type": "hunyuan_v1_dense",
        "norm_type": "rms", "num_attention_heads": 32, "num_experts": 1,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "pad_token_id": 127961,
        "pretraining_tp": 1, "q_lora_rank": None, "rms_norm_eps": 1e-05,
        "rope_scaling": {"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "type": "dynamic"},
        "rope_theta": 10000.0, "routed_scaling_factor": False, "sliding_window": None,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
        "use_cla": False, "use_mla": False, "use_qk_norm": True, "use_rotary_pos_emb": True,
        "vocab_size": 128256},
    "seed_oss": {
        "architectures": ["SeedOssForCausalLM"], "attention_bias": True,
        "attention_dropout": 0.1, "attention_out_bias": False, "bos_token_id": 0,
        "pad_token_id": 1, "eos_token_id": 2, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 27648,
        "max_position_embeddings": 524288, "mlp_bias": False, "model_type": "seed_oss",
        "num_attention_heads": 80, "num_hidden_layers": 64, "num_key_value_heads": 8,
        "residual_dropout": 0.1, "rms_norm_eps": 1e-06, "rope_scaling": {"rope_type": "default"},
        "rope_theta": 10000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": 155136},
    "apertus": {
        "architectures": ["ApertusForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 68, "hidden_act": "xielu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 21504,
        "max_position_embeddings": 65536, "mlp_bias": False, "model_type": "apertus",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "pad_token_id": 3, "post_norm": False, "qk_norm": True, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 12000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": 131072},
}


def _hf(cfg: dict):
    from transformers import AutoConfig

    return AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in copy.deepcopy(cfg).items()
                                                       if k != "model_type"})


def _hf_rope(hf, layer_type: str) -> dict:
    params = hf.rope_parameters
    return params[layer_type] if layer_type in params else params


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_config_loads_as_transformers_reads_it(name):
    cfg = PUBLISHED[name]
    ours, hf = parse_config(cfg), _hf(cfg)
    assert (ours.num_layers, ours.num_heads, ours.num_kv_heads, ours.hidden_size) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.hidden_size)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert ours.head_dim == head_dim and ours.norm_eps == hf.rms_norm_eps
    assert ours.tie_word_embeddings == hf.tie_word_embeddings
    types = getattr(hf, "layer_types", None) or ["full_attention"] * hf.num_hidden_layers
    window = getattr(hf, "sliding_window", None)
    assert ours.layer_windows == tuple(window if t == "sliding_attention" else None
                                       for t in types)
    for i, t in enumerate(types):
        rope, ref = ours.ropes[ours.layer_rope[i]], _hf_rope(hf, t)
        assert rope.theta == ref["rope_theta"] or name == "hunyuan_v1_dense"
        assert rope.scaling.value == ref.get("rope_type", "default") or name == "hunyuan_v1_dense"
        if "factor" in ref and ref.get("rope_type") != "default":
            assert rope.factor == ref["factor"]
        frac = ref.get("partial_rotary_factor", 1.0)
        assert ours.rot_dim == int(head_dim * frac)


def test_published_hunyuan_ntk_alpha_base_is_transformers():
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import (
        HunYuanDenseV1RotaryEmbedding,
    )

    cfg = PUBLISHED["hunyuan_v1_dense"]
    hf = _hf(cfg)
    hf.head_dim = 128
    ref = HunYuanDenseV1RotaryEmbedding(hf).inv_freq
    ours = parse_config(cfg).ropes[0]
    theta = torch.tensor(ours.theta, dtype=torch.float64)
    inv = 1.0 / theta ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    assert torch.allclose(inv.float(), ref, rtol=1e-6)


def test_published_moe_configs_route_as_published():
    glm = parse_config(PUBLISHED["glm4_moe"])
    assert glm.moe.scoring == "sigmoid" and glm.moe.num_experts == 128 and glm.moe.top_k == 8
    assert glm.layer_moe == (False,) + (True,) * 45 and glm.ignored_layers == (46,)
    assert glm.moe.shared_expert_size == 1408
    ernie = parse_config(PUBLISHED["ernie4_5_moe"])
    assert ernie.moe.num_experts == 64 and ernie.moe.top_k == 6
    assert ernie.moe.shared_expert_size == 2 * 1536 and ernie.moe.norm_min == 1e-12
    assert ernie.layer_moe == (False,) + (True,) * 27
    exa = parse_config(PUBLISHED["exaone4"])
    assert exa.layer_use_rope == tuple(t == "sliding_attention" for t in _L4 * 16)


@pytest.mark.parametrize("name, key, value, neutral", [
    ("hunyuan_v1_dense", "use_cla", True, "False"),
    ("hunyuan_v1_dense", "use_qk_norm", False, "True"),
    ("hunyuan_v1_dense", "attention_head_dim", 64, "128"),
    ("glm4_moe", "scoring_func", "softmax", "'sigmoid'"),
    ("apertus", "post_norm", True, "False"),
])
def test_a_key_at_a_value_that_changes_the_forward_is_refused_naming_the_neutral_one(
        name, key, value, neutral):
    cfg = {**PUBLISHED[name], key: value}
    with pytest.raises(ConfigError, match=rf"{key} = {value!r} is not supported.*only {neutral}"):
        parse_config(cfg)


def test_ernie4_5_moe_with_use_bias_equals_transformers(tmp_path, make_ids):
    """``use_bias`` on the MoE class (no published checkpoint sets it, but transformers runs
    it): biases on q/k/v/o, the dense layer's MLP, the shared experts and the head, none on
    the routed experts. Once refused; now logits, residual streams and patterns < 1e-4,
    left padding and greedy tokens as transformers'."""
    from tests.support.family_checks import (assert_greedy_tokens_equal_transformers,
                                             assert_left_padding_rows_alone,
                                             assert_matches_transformers)
    from tests.transformer.conftest import make_tiny

    t = make_tiny(tmp_path, "ernie4_5_moe_bias", "ernie4_5_moe", {
        "head_dim": 16, "use_bias": True, "moe_num_experts": 4, "moe_k": 2,
        "moe_intermediate_size": 32, "moe_num_shared_experts": 2, "tie_word_embeddings": True})
    names = set(safe_open_names(t.path / "model.safetensors"))
    assert {"lm_head.bias", "model.layers.1.mlp.shared_experts.up_proj.bias",
            "model.layers.0.mlp.down_proj.bias"} <= names  # what use_bias adds
    ids = make_ids(1, 14, seed=5)
    assert_matches_transformers(t, ids)
    model = t.load()
    assert_left_padding_rows_alone(model, [ids[0], make_ids(1, 9, seed=6)[0]])
    assert_greedy_tokens_equal_transformers(t.hf, model, ids)


def safe_open_names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return list(f.keys())


def test_exaone4_string_pattern_without_layer_types_is_refused():
    cfg = {k: v for k, v in PUBLISHED["exaone4"].items() if k != "layer_types"}
    with pytest.raises(ConfigError, match="sliding_window_pattern"):
        parse_config(cfg)


def test_glm4_moe_mtp_layer_tensors_are_ignored_not_refused():
    from mi_transformer.weights import check_tensors, expected_shapes

    cfg = parse_config({**PUBLISHED["glm4_moe"], "num_hidden_layers": 2,
                        "n_routed_experts": 4, "num_experts_per_tok": 2, "hidden_size": 8,
                        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
                        "intermediate_size": 8, "moe_intermediate_size": 4, "vocab_size": 10})
    shapes = dict(expected_shapes(cfg))
    shapes["model.layers.2.eh_proj.weight"] = (8, 16)  # the MTP module after the last layer
    shapes["model.layers.2.self_attn.q_proj.weight"] = (8, 8)
    assert check_tensors(cfg, shapes).ok
    shapes["model.layers.3.self_attn.q_proj.weight"] = (8, 8)  # beyond the MTP layer
    assert not check_tensors(cfg, shapes).ok


@pytest.mark.parametrize("name", ["glm4_moe", "ernie4_5_moe"])
def test_routing_equals_transformers_router(tiny, loaded, make_ids, name):
    """Fed our captured MLP input, transformers' router picks the same experts (as sets) with
    the same weights: sigmoid / softmax scores, the selection bias, groups, scaling."""
    t, model = tiny(name), loaded(name)
    ids = make_ids(2, 12, seed=24)
    layers = [i for i, f in enumerate(model.config.layer_moe) if f]
    pts = [f"blocks.{i}.mlp.{p}" for i in layers for p in
           ("hook_in", "hook_expert_weights", "hook_expert_indices")]
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    k = model.config.moe.top_k
    for i in layers:
        gate = t.hf.model.layers[i].mlp.gate
        assert gate.e_score_correction_bias.abs().max() > 0.01 if hasattr(
            gate, "e_score_correction_bias") else gate.moe_statics.e_score_correction_bias.abs(
        ).max() > 0.01  # the bias really takes part
        with torch.no_grad():
            _, w_ref, i_ref = gate(cache[f"blocks.{i}.mlp.hook_in"].reshape(-1, 64))
        w = cache[f"blocks.{i}.mlp.hook_expert_weights"].reshape(-1, k)
        idx = cache[f"blocks.{i}.mlp.hook_expert_indices"].reshape(-1, k)
        o_ref, o = i_ref.sort(-1), idx.sort(-1)
        assert torch.equal(o_ref.values, o.values)
        assert (w.gather(1, o.indices) - w_ref.gather(1, o_ref.indices)).abs().max() < 1e-5
