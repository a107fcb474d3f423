"""Config parsing: both config.json formats, every family's axes, auto-config, bad configs."""

from __future__ import annotations

import copy
import math

import pytest

from mi_core import serialize
from mi_core.errors import ConfigError
from mi_transformer.config import (FAMILY_PARSERS, Activation, MlpLayout, NormType, QkvLayout,
                                   RopeScaling, TransformerConfig, parse_config)

from tests.support.tiny_families import FAMILIES


def _to_hub_format(cfg: dict) -> dict:
    """transformers-5 `rope_parameters` -> the older `rope_theta` / `rope_scaling` spelling."""
    old = copy.deepcopy(cfg)
    params = old.pop("rope_parameters")
    if "full_attention" in params:  # Gemma 3: per layer type
        full, local = params["full_attention"], params["sliding_attention"]
        old["rope_theta"] = full.pop("rope_theta")
        old["rope_local_base_freq"] = local["rope_theta"]
        params = full
    else:
        old["rope_theta"] = params.pop("rope_theta")
    if "partial_rotary_factor" in params:  # a top-level key in the hub spelling
        old["partial_rotary_factor"] = params.pop("partial_rotary_factor")
    if params.get("rope_type", "default") != "default":
        old["rope_scaling"] = params
    return old


# OLMo-3's tiny config gives its sliding and full layers different bases, which only the
# nested rope_parameters spell (its hub format is tested in test_transformer_families_recent)
_ROTARY = [n for n, (mt, _) in FAMILIES.items() if mt not in ("gpt2", "gptj", "opt", "olmo3")]


@pytest.mark.parametrize("name", _ROTARY)
def test_rope_parameters_and_rope_theta_formats_parse_to_the_same_config(tiny, name):
    new = tiny(name).config
    assert "rope_parameters" in new  # what transformers 5 wrote
    old = _to_hub_format(new)
    assert "rope_parameters" not in old
    assert parse_config(new) == parse_config(old)


def test_llama3_rope_scaling_is_parsed(tiny):
    c = parse_config(tiny("llama3_rope").config)
    assert c.ropes[0].scaling is RopeScaling.LLAMA3
    assert (c.ropes[0].factor, c.ropes[0].original_max_positions) == (8.0, 16)


def test_family_axes(tiny):
    """Spot checks of what makes each family different (values from the HF configs used)."""
    g2 = parse_config(tiny("gemma2").config)
    assert g2.norm_type is NormType.GEMMA_RMS and g2.post_norms
    assert g2.attn_softcap == 2.0 and g2.final_softcap == 5.0
    assert g2.attn_scale == 8 ** -0.5 and g2.embedding_scale == math.sqrt(64)
    assert g2.layer_windows == (5, None, 5)  # even layers slide
    g3 = parse_config(tiny("gemma3_text").config)
    assert g3.qk_norm and len(g3.ropes) == 2 and g3.layer_rope[0] != g3.layer_rope[1]
    assert {r.theta for r in g3.ropes} == {10_000.0, 1_000_000.0}
    phi = parse_config(tiny("phi3").config)
    assert phi.qkv_layout is QkvLayout.FUSED and phi.mlp_layout is MlpLayout.GATED_FUSED
    sc = parse_config(tiny("starcoder2").config)
    assert sc.norm_type is NormType.LAYER_NORM and sc.mlp_layout is MlpLayout.PLAIN
    assert sc.qkv_bias and sc.o_bias and sc.mlp_bias and sc.activation is Activation.GELU_TANH
    assert parse_config(tiny("qwen2_tied").config).tie_word_embeddings
    assert not parse_config(tiny("qwen2_untied").config).tie_word_embeddings
    assert parse_config(tiny("mistral").config).layer_windows == (5, 5, 5)
    assert parse_config(tiny("qwen3").config).qk_norm


def test_gemma3_hub_format_applies_rope_scaling_to_global_layers_only():
    cfg = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 6, "vocab_size": 10,
           "intermediate_size": 8, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 4,
           "sliding_window_pattern": 6, "query_pre_attn_scalar": 16}
    c = parse_config(cfg)
    glob, local = c.ropes[c.layer_rope[5]], c.ropes[c.layer_rope[0]]
    assert glob.scaling is RopeScaling.LINEAR and glob.factor == 8.0 and glob.theta == 1e6
    assert local.scaling is RopeScaling.NONE and local.theta == 1e4
    assert c.layer_windows == (4, 4, 4, 4, 4, None)


def test_config_round_trips_through_json(tiny):
    c = parse_config(tiny("gemma3_text").config)
    assert serialize.from_json(serialize.to_json(c), TransformerConfig) == c


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "vocab_size",
                                   "intermediate_size", "num_attention_heads", "model_type"])
def test_missing_config_field_is_a_config_error_naming_it(tiny, field):
    cfg = tiny("llama").config
    del cfg[field]
    with pytest.raises(ConfigError, match=field):
        parse_config(cfg, "some/config.json")


@pytest.mark.parametrize("kind", ["su", "ntk_by_parts_v9"])
def test_unsupported_rope_scaling_is_a_config_error(tiny, kind):
    cfg = tiny("llama").config
    cfg["rope_parameters"] = {"rope_type": kind, "factor": 2.0, "rope_theta": 1e4}
    with pytest.raises(ConfigError, match=kind):
        parse_config(cfg)


def test_unsupported_activation_is_a_config_error(tiny):
    cfg = tiny("llama").config
    cfg["hidden_act"] = "relu6"
    with pytest.raises(ConfigError, match="relu6"):
        parse_config(cfg)


def test_heads_not_divisible_by_kv_heads_is_a_config_error(tiny):
    cfg = tiny("llama").config
    cfg["num_key_value_heads"] = 3
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        parse_config(cfg)


def test_every_family_of_the_issues_has_a_parser():
    assert set(FAMILY_PARSERS) >= {
        "llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "starcoder2",
        "mistral", "helium", "gpt2", "gpt_neox", "gptj", "phi", "opt", "falcon", "stablelm"}


@pytest.mark.parametrize("name", ["gpt_neox", "gpt_neox_sequential"])
def test_neox_hub_spelling_rotary_pct_and_rotary_emb_base_parses_like_rope_parameters(tiny, name):
    """Pythia's config.json on the hub says rotary_pct / rotary_emb_base; transformers 5
    writes rope_parameters with partial_rotary_factor / rope_theta."""
    new = tiny(name).config
    old = copy.deepcopy(new)
    params = old.pop("rope_parameters")
    old["rotary_pct"], old["rotary_emb_base"] = params["partial_rotary_factor"], params["rope_theta"]
    c = parse_config(old)
    assert c == parse_config(new)
    assert (c.rotary_dim, c.ropes[0].theta) == (8, 500.0)  # 0.5 of head_dim 16; the tiny base


def test_neox_spellings_that_disagree_are_a_config_error(tiny):
    cfg = tiny("gpt_neox").config
    cfg["rotary_pct"] = 0.25  # rope_parameters says 0.5
    with pytest.raises(ConfigError, match="rotary_pct"):
        parse_config(cfg)
