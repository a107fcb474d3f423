"""Config strictness of the hybrid families: the schedule read as transformers reads it, keys
that would change the numbers refused by name, keys known not to (or at their neutral value)
accepted, the legacy spellings read."""

from __future__ import annotations

import json
from typing import Any

import pytest

import mi_core as mi

from tests.support.hybrid_tiny import tiny_hybrid


def _cfg(name: str, **changes: Any) -> dict[str, Any]:
    cfg = json.loads((tiny_hybrid(name).path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def _parse(cfg: dict[str, Any]) -> Any:
    from mi_transformer.config import parse_config

    return parse_config(cfg, "<test>")


@pytest.mark.parametrize("name, changes, match", [
    ("jamba", {"attn_layer_offset": 4}, "attn_layer_offset"),
    ("jamba", {"num_local_experts": 3}, "disagree"),
    ("jamba", {"mamba_dt_rank": 2.5}, "mamba_dt_rank"),
    ("bamba", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                   "partial_rotary_factor": 1.0}}, "partial_rotary_factor"),
    ("bamba", {"attn_layer_indices": [7]}, "attn_layer_indices"),
    ("bamba", {"mamba_n_heads": 6}, "mamba_n_heads|n_heads"),
    ("granitemoehybrid", {"layer_types": ["mamba", "attention"]}, "layer_types"),
    ("granitemoehybrid", {"position_embedding_type": "alibi"}, "position_embedding_type"),
    ("granitemoehybrid", {"normalization_function": "layernorm"}, "normalization_function"),
    # MoE layers are implemented (tests/ssm/test_ssm_nemotron_moe.py); their shared
    # expert's biases are not, nor is a layer kind transformers does not know
    ("nemotron_h", {"layers_block_type": ["linear_attention", "moe", "full_attention",
                                          "mlp"], "mlp_bias": True}, "mlp_bias"),
    ("nemotron_h", {"layers_block_type": None, "hybrid_override_pattern": "M-*X"}, "'X'"),
    ("nemotron_h", {"hybrid_override_pattern": "M*-M"}, "disagrees"),
    ("nemotron_h", {"residual_in_fp32": True}, "residual_in_fp32"),
    ("nemotron_h", {"some_new_key": 1}, "some_new_key"),
])
def test_a_value_that_would_change_the_numbers_is_refused_naming_the_key(
        name: str, changes: dict[str, Any], match: str) -> None:
    with pytest.raises(mi.ConfigError, match=match):
        _parse(_cfg(name, **changes))


def test_the_schedules_are_read_as_transformers_reads_them() -> None:
    j = _parse(_cfg("jamba"))
    assert j.layer_mixers == ("mamba", "mamba", "attention", "mamba")
    assert j.layer_moe == (True, False, True, False)
    legacy = _parse(_cfg("nemotron_h", layers_block_type=None, hybrid_override_pattern="M-*M",
                         n_groups=None, mamba_n_groups=2, conv_kernel=None, mamba_d_conv=4))
    assert legacy.layer_mixers == ("mamba2", "mlp", "attention", "mamba2")
    assert legacy.layer_mlp == (False, True, False, False)
    assert legacy.mixers[0].settings.n_groups == 2
    g = _parse(_cfg("granitemoehybrid", layer_types=["linear_attention", "full_attention",
                                                     "linear_attention"]))
    assert g.layer_mixers == ("mamba2", "attention", "mamba2")
    b = _parse(_cfg("bamba", mamba_d_head="auto"))
    assert b.mixers[0].settings.head_dim == 8 and b.rotary_dim == 4


@pytest.mark.parametrize("name, changes", [
    ("granitemoehybrid", {"normalization_function": "rmsnorm", "init_method": "mup"}),
    ("nemotron_h", {"auto_map": {"AutoConfig": "configuration_nemotron_h.NemotronHConfig"},
                    "time_step_limit": [0.0, 0.1], "expand": 3, "attention_bias": True}),
    ("jamba", {"use_mamba_kernels": False, "num_local_experts": 4}),
])
def test_keys_that_cannot_change_the_numbers_are_accepted(name: str,
                                                          changes: dict[str, Any]) -> None:
    assert _parse(_cfg(name, **changes)) == _parse(_cfg(name))
