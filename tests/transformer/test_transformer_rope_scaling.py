"""YaRN and LongRoPE scaling, against transformers' own RoPE code and models.

References: ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` for the frequencies and
the attention factor (same config object), and the tiny Phi-3 (longrope, 128k-style top-level
``original_max_position_embeddings``) and Qwen2 (yarn, Qwen2.5's long-context config) models of
tests/support/tiny_families.py for whole forwards. Tolerances: frequencies 1e-6 relative,
logits / residual streams / patterns max abs diff < 1e-4 (F32).
"""

from __future__ import annotations

import pytest
import torch

from mi_core.errors import ConfigError
from mi_transformer.config import RopeScaling, parse_config
from mi_transformer.rope import attention_scaling, inv_freq
from tests.support.family_checks import assert_left_padding_rows_alone, assert_matches_transformers
from tests.support.tiny_families import _COMMON, _LONG, _SHORT, FAMILIES

YARN_VARIANTS = {
    "qwen2.5_style": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "betas_and_attention_factor": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 8.0,
                                   "beta_slow": 2.0, "attention_factor": 1.3,
                                   "original_max_position_embeddings": 16},
    "mscale_ratio_no_truncate": {"rope_type": "yarn", "factor": 16.0, "mscale": 1.0,
                                 "mscale_all_dim": 0.5, "truncate": False,
                                 "original_max_position_embeddings": 8},
}


def _hf_rope(model_type: str, overrides: dict, seq_len: int | None = None):
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = AutoConfig.for_model(model_type, **{**_COMMON, **overrides})
    kind = cfg.rope_parameters["rope_type"]
    return ROPE_INIT_FUNCTIONS[kind](cfg, None, seq_len=seq_len), cfg.to_dict()


@pytest.mark.parametrize("variant", list(YARN_VARIANTS))
def test_yarn_frequencies_and_attention_factor_equal_transformers(variant):
    (ref_inv, ref_scale), cfg = _hf_rope("llama", {"rope_scaling": YARN_VARIANTS[variant]})
    ours = parse_config(cfg)
    rope = ours.ropes[0]
    assert rope.scaling is RopeScaling.YARN
    torch.testing.assert_close(inv_freq(rope, ours.rot_dim), ref_inv, rtol=1e-6, atol=0)
    assert attention_scaling(rope) == pytest.approx(ref_scale, rel=1e-12)
    assert attention_scaling(rope) != 1.0  # the scaling is really exercised


@pytest.mark.parametrize("seq_len", [None, 8, 9, 40])
def test_longrope_short_and_long_factors_switch_where_transformers_switches(seq_len):
    """Short factors up to original_max_position_embeddings (8), long ones beyond; the
    attention factor from max_position_embeddings / original (64 / 8)."""
    overrides = FAMILIES["phi3_longrope"][1]
    (ref_inv, ref_scale), cfg = _hf_rope("phi3", overrides, seq_len=seq_len)
    ours = parse_config(cfg)
    rope = ours.ropes[0]
    torch.testing.assert_close(inv_freq(rope, ours.rot_dim, seq_len), ref_inv, rtol=1e-6, atol=0)
    assert attention_scaling(rope) == pytest.approx(ref_scale, rel=1e-12)
    assert rope.factor == 8.0  # 64 / 8, derived like transformers (no explicit factor)


@pytest.mark.parametrize("name", ["phi3_longrope", "qwen2_yarn"])
def test_scaled_rope_family_matches_transformers_past_the_original_length(tiny, make_ids, name):
    assert_matches_transformers(tiny(name), make_ids(2, 16, seed=11))


def test_longrope_model_matches_transformers_within_the_original_length(tiny, make_ids):
    """6 tokens < 8: the short factors (a different number than the 16-token case)."""
    assert_matches_transformers(tiny("phi3_longrope"), make_ids(2, 6, seed=12))


def test_yarn_model_left_padding_rows_equal_running_alone(tiny, make_ids):
    model = tiny("qwen2_yarn").load()
    assert_left_padding_rows_alone(model, [make_ids(1, 14, seed=5)[0], make_ids(1, 9, seed=6)[0]])


def test_longrope_model_left_padding_rows_equal_running_alone(tiny, make_ids):
    """Both rows past the original length, so both use the long factors alone too
    (transformers picks the factor set from the longest position of the whole batch)."""
    model = tiny("phi3_longrope").load()
    assert_left_padding_rows_alone(model, [make_ids(1, 14, seed=5)[0], make_ids(1, 10, seed=6)[0]])


@pytest.mark.parametrize("bad, key", [
    ({"type": "longrope", "short_factor": "1.0", "long_factor": _LONG}, "short_factor"),
    ({"type": "longrope", "short_factor": _SHORT, "long_factor": []}, "long_factor"),
    ({"type": "yarn", "factor": "4", "original_max_position_embeddings": 16}, "factor"),
    ({"type": "yarn", "factor": 4.0, "beta_fast": [1], "original_max_position_embeddings": 16},
     "beta_fast"),
    ({"type": "yarn", "factor": 4.0, "truncate": "no", "original_max_position_embeddings": 16},
     "truncate"),
])
def test_malformed_scaling_fields_are_config_errors_naming_the_key(bad, key):
    cfg = {**_COMMON, "model_type": "llama", "rope_scaling": bad}
    with pytest.raises(ConfigError, match=key):
        parse_config(cfg)


def test_longrope_factors_of_the_wrong_length_are_a_config_error():
    cfg = {**_COMMON, "model_type": "phi3", "original_max_position_embeddings": 8,
           "rope_scaling": {"type": "longrope", "short_factor": _SHORT[:3], "long_factor": _LONG}}
    with pytest.raises(ConfigError, match="short_factor.*3.*8"):
        parse_config(cfg)
