"""Config strictness of Zamba2 and MiniMax: what transformers writes (``save_pretrained``,
which every parity test loads, and ``to_dict()`` with every default) gives transformers'
numbers; the schedules and derived values read as transformers reads them (its defaults
included); values that would change the numbers refused by name; keys that cannot, accepted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import mi_core as mi

from tests.support.zamba2_minimax_tiny import ZM_FAMILIES, tiny_zm, zm_ids


def _cfg(name: str, **changes: Any) -> dict[str, Any]:
    cfg = json.loads((tiny_zm(name).path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def _parse(cfg: dict[str, Any]) -> Any:
    from mi_transformer.config import parse_config

    return parse_config(cfg, "<test>")


@pytest.mark.parametrize("name", sorted(ZM_FAMILIES))
def test_the_config_transformers_to_dict_gives_loads_with_transformers_numbers(
        name: str, tmp_path: Path) -> None:
    t = tiny_zm(name)
    text = t.hf.config.to_json_string(use_diff=False)
    assert len(json.loads(text)) > len(json.loads((t.path / "config.json").read_text()))
    d = tmp_path / "to_dict"
    d.mkdir()
    (d / "config.json").write_text(text)
    for f in t.path.glob("*.safetensors"):
        (d / f.name).symlink_to(f)
    ids = zm_ids(1, 9, seed=4)
    with torch.no_grad():
        want = t.hf(ids).logits
    got = mi.MIModel.from_pretrained(d).forward(ids).output
    assert (got - want).abs().max().item() < 1e-4


def test_transformers_default_schedules_are_read_as_transformers_reads_them() -> None:
    from transformers import AutoConfig

    z = AutoConfig.for_model("zamba2", num_hidden_layers=54)  # the default layers_block_type
    cfg = _parse(json.loads(z.to_json_string(use_diff=False)))
    assert [i for i, j in enumerate(cfg.layer_shared) if j is not None] == z.hybrid_layer_ids
    assert cfg.layer_mixers == ("mamba2",) * 54 and cfg.head_dim == 2 * 2560 // 32
    assert cfg.attn_scale == (cfg.head_dim / 2) ** -0.5 and cfg.intermediate_size == 4 * 2560
    m = AutoConfig.for_model("minimax", num_hidden_layers=4)  # the default layer_types
    cfg = _parse(json.loads(m.to_json_string(use_diff=False)))
    assert cfg.layer_mixers == tuple("attention" if t == "full_attention" else
                                     "lightning_attention" for t in m.layer_types)
    assert cfg.ropes[0].theta == 1e6  # MiniMax's own default theta


def test_zamba2s_legacy_layer_kinds_and_derived_values_are_read() -> None:
    kinds = ["mamba", "hybrid", "mamba", "hybrid", "hybrid"]
    legacy = _parse(_cfg("zamba2", layers_block_type=kinds))
    assert legacy == _parse(_cfg("zamba2"))
    assert legacy.shared_block.num_blocks == 2 and legacy.layer_shared == (None, 0, None, 1, 2)
    same = _parse(_cfg("zamba2", layers_block_type=None, layer_types=kinds))
    assert same.layer_shared == legacy.layer_shared
    assert _parse(_cfg("zamba2", use_long_context=True)).max_positions == 16384
    # the original checkpoints' keys, at what transformers does
    assert _parse(_cfg("zamba2", use_shared_mlp_adapter=True, use_conv_bias=False,
                       use_mem_eff_path=True)) == legacy


@pytest.mark.parametrize("name, changes, match", [
    ("zamba2", {"num_key_value_heads": 2}, "use_shared_attention_adapter"),
    ("zamba2", {"use_shared_mlp_adapter": False}, "use_shared_mlp_adapter"),
    ("zamba2", {"attention_hidden_size": 48}, "attention_hidden_size"),
    ("zamba2", {"mamba_headdim": 4}, "n_mamba_heads|mamba_headdim"),
    ("zamba2", {"hybrid_layer_ids": [1, 3]}, "hybrid_layer_ids"),
    ("zamba2", {"layers_block_type": ["mamba", "hybrid"]}, "layers_block_type"),
    ("zamba2", {"layers_block_type": ["mamba", "attention", "mamba", "hybrid", "hybrid"]},
     "layers_block_type"),
    ("zamba2", {"layer_types": ["mamba"] * 5}, "disagree"),
    ("zamba2", {"hidden_act": "tanh"}, "hidden_act"),
    ("minimax", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                     "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ("minimax", {"layer_types": ["linear_attention"] * 3}, "layer_types"),
    ("minimax", {"layer_types": ["linear_attention", "sliding_attention", "full_attention",
                                 "linear_attention"]}, "layer_types"),
    ("minimax", {"hidden_act": "tanh"}, "hidden_act"),
    ("minimax", {"num_experts": 3}, "disagree"),
    ("minimax", {"postnorm": False}, "postnorm"),
])
def test_a_value_that_would_change_the_numbers_is_refused_naming_the_key(
        name: str, changes: dict[str, Any], match: str) -> None:
    with pytest.raises(mi.ConfigError, match=match):
        _parse(_cfg(name, **changes))


def test_minimax_reads_its_residual_factors_and_sliding_window() -> None:
    cfg = _parse(_cfg("minimax"))
    alpha = 3.5565588200778455
    assert cfg.norm_residual and cfg.layer_residual_scales == (
        (alpha, 0.8, alpha, 1.1), (alpha, 0.8, alpha, 1.1), (alpha, 0.9, alpha, 1.1),
        (alpha, 0.8, alpha, 1.1))
    windowed = _parse(_cfg("minimax", sliding_window=4))
    assert windowed.layer_windows[2] == 4
    assert _parse(_cfg("minimax", router_jitter_noise=0.1, output_router_logits=True)) == cfg


@pytest.mark.parametrize("name", ["zamba2", "zamba2_gqa"])
def test_the_memory_check_counts_zamba2s_weight_sets_once(name: str) -> None:
    """The size estimate before loading (a lower bound: biases and the final norm left out)
    counts the shared attention and MLP once per weight set, not on every layer."""
    from mi_transformer.config.size import param_count

    t = tiny_zm(name)
    n = param_count(_parse(_cfg(name)))
    assert 0.99 * t.hf.num_parameters() <= n <= t.hf.num_parameters()
