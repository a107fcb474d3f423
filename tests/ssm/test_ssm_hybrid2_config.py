"""Config strictness of Falcon-H1, LFM2 and LFM2-MoE: read as transformers reads them (its class
defaults for absent keys, LFM2's adjusted MLP width and legacy spellings), values that would
change the numbers refused by name, the published configs' extra keys accepted at their
neutral value only; what transformers writes (``to_dict()``, every attribute) loads with its
numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import mi_core as mi

from tests.support.hybrid2_tiny import HYBRID2_FAMILIES, tiny_hybrid2


def _cfg(name: str, **changes: Any) -> dict[str, Any]:
    cfg = json.loads((tiny_hybrid2(name).path / "config.json").read_text())
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def _parse(cfg: dict[str, Any]) -> Any:
    from mi_transformer.config import parse_config

    return parse_config(cfg, "<test>")


@pytest.mark.parametrize("name, changes, match", [
    ("falcon_h1", {"ssm_multipliers": [1.0, 2.0]}, "ssm_multipliers"),
    ("falcon_h1", {"mlp_multipliers": [1.0]}, "mlp_multipliers"),
    ("falcon_h1", {"mamba_d_ssm": 40}, "mamba_n_heads|n_heads"),
    ("falcon_h1", {"partial_rotary_factor": 0.5}, "partial rotary"),
    ("falcon_h1", {"mamba_rms_norm": "yes"}, "mamba_rms_norm"),
    ("falcon_h1", {"hidden_act": "gelu"}, "hidden_act"),
    ("falcon_h1", {"mamba_use_mlp": False}, "mamba_use_mlp"),
    ("falcon_h1", {"attn_layer_indices": [0]}, "attn_layer_indices"),
    ("falcon_h1", {"some_new_key": 1}, "some_new_key"),
    ("lfm2", {"layer_types": ["conv", "conv", "sliding_attention", "conv"]}, "layer_types"),
    ("lfm2", {"layer_types": ["conv", "full_attention"]}, "layer_types"),
    ("lfm2", {"full_attn_idxs": [9]}, "full_attn_idxs"),
    ("lfm2", {"hidden_act": "gelu"}, "hidden_act"),
    ("lfm2", {"block_dim": 64}, "block_dim"),
    ("lfm2", {"theta": 10.0}, "theta"),
    ("lfm2", {"block_use_swiglu": False}, "block_use_swiglu"),
    ("lfm2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                  "partial_rotary_factor": 0.5}}, "partial rotary"),
    ("lfm2_moe", {"layer_types": ...}, "layer_types is required"),
    ("lfm2_moe", {"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ("lfm2_moe", {"full_attn_idxs": [1]}, "full_attn_idxs"),
])
def test_a_value_that_would_change_the_numbers_is_refused_naming_the_key(
        name: str, changes: dict[str, Any], match: str) -> None:
    with pytest.raises(mi.ConfigError, match=match):
        _parse(_cfg(name, **changes))


def test_falcon_h1_reads_absent_keys_as_transformers_defaults_and_null_as_it_does() -> None:
    """transformers' FalconH1Config: mamba_d_ssm absent is 1024, null is expand * hidden
    (then mamba_d_head "auto" divides it); num_key_value_heads absent is 8, null the heads."""
    absent = _parse(_cfg("falcon_h1", mamba_d_ssm=..., mamba_d_head="auto", mamba_n_heads=8,
                         num_attention_heads=8, num_key_value_heads=...))
    assert absent.mixers[0].settings.d_inner == 1024
    assert absent.mixers[0].settings.head_dim == 128 and absent.num_kv_heads == 8
    null = _parse(_cfg("falcon_h1", mamba_d_ssm=None, mamba_d_head="auto",
                       num_key_value_heads=None))
    assert null.mixers[0].settings.d_inner == 64 and null.mixers[0].settings.head_dim == 8
    assert null.num_kv_heads == 4
    s = _parse(_cfg("falcon_h1_norm")).mixers[0].settings
    assert (s.gate_norm, s.out_bias, s.n_groups) == ("before_gate", True, 2)
    s = _parse(_cfg("falcon_h1_norm", mamba_norm_before_gate=False)).mixers[0].settings
    assert s.gate_norm == "after_gate"
    s = _parse(_cfg("falcon_h1", ssm_multipliers=[1, 1, 1, 1, 1])).mixers[0].settings
    assert s.gate_norm == "none" and s.proj_scales is None


def test_lfm2_mlp_width_schedule_and_tying_follow_transformers() -> None:
    """Lfm2Config / Lfm2MLP: block_ff_dim wins over intermediate_size; with
    block_auto_adjust_ff_dim, int(2 w / 3), times block_ffn_dim_multiplier, rounded up to
    block_multiple_of; tie_embedding wins; without
    layer_types, full_attn_idxs (default: every layer attention). Widths are transformers'
    own: its MLP's w1 rows for the same config."""
    from transformers import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP

    for extra in ({}, {"block_ff_dim": 200}, {"block_ffn_dim_multiplier": 1.5},
                  {"block_ffn_dim_multiplier": 0.7}, {"block_auto_adjust_ff_dim": False},
                  {"block_multiple_of": 7, "intermediate_size": 100}):
        cfg = _cfg("lfm2", **extra)
        want = Lfm2MLP(Lfm2Config(**{k: v for k, v in cfg.items()
                                     if k not in ("architectures", "transformers_version")})
                       ).w1.weight.shape[0]
        assert _parse(cfg).intermediate_size == want, extra
    c = _parse(_cfg("lfm2", layer_types=..., full_attn_idxs=[1, 3]))
    assert c.layer_mixers == ("short_conv", "attention", "short_conv", "attention")
    assert _parse(_cfg("lfm2", layer_types=...)).layer_mixers == ("attention",) * 4
    assert _parse(_cfg("lfm2", tie_embedding=False)).tie_word_embeddings is False


def test_lfm2_moe_schedule_router_and_dense_layers_follow_transformers() -> None:
    """Lfm2MoeConfig: the first num_dense_layers have a SwiGLU of intermediate_size as it is
    (its MLP ignores LFM2's block_* width keys), the rest experts of moe_intermediate_size;
    sigmoid scores with the expert bias for the choice (not with use_expert_bias false)."""
    c = _parse(_cfg("lfm2_moe", block_auto_adjust_ff_dim=True, block_multiple_of=256))
    assert c.intermediate_size == 64 and c.layer_moe == (False, True, True, True)
    assert (c.moe.expert_size, c.moe.scoring, c.moe.selection_bias, c.moe.routed_scaling,
            c.moe.sigmoid_norm_eps) == (16, "sigmoid", "expert_bias", 1.5, 1e-6)
    assert _parse(_cfg("lfm2_moe", use_expert_bias=False)).moe.selection_bias == ""
    assert _parse(_cfg("lfm2_moe", num_dense_layers=0)).layer_moe == (True,) * 4


def test_published_keys_are_accepted_at_their_neutral_value() -> None:
    """Keys of the released configs transformers does not read (Falcon-H1-0.5B's
    mamba_use_mlp, attn_layer_indices, mlp_expansion_factor; LFM2's block_* / conv_* /
    theta / use_pos_enc / initialisation keys) at the values the released configs carry."""
    f = _cfg("falcon_h1")
    assert _parse({**f, "mamba_use_mlp": True, "attn_layer_indices": None,
                   "mlp_expansion_factor": 8, "num_logits_to_keep": 1}) == _parse(f)
    g = _cfg("lfm2")
    published = {"block_dim": 32, "block_ff_dim": 96, "block_ffn_dim_multiplier": 1.0,
                 "block_mlp_init_scale": 1.0, "block_multiple_of": 16, "block_norm_eps": 1e-5,
                 "block_out_init_scale": 1.0, "block_use_swiglu": True,
                 "block_use_xavier_init": True, "conv_dim": 32, "conv_dim_out": 32,
                 "conv_use_xavier_init": True, "num_heads": 4, "theta": 1000000.0,
                 "rope_theta": 1000000.0, "rope_parameters": None, "use_pos_enc": True,
                 "tie_embedding": True}
    assert _parse({**g, **published}) == _parse(g)


@pytest.mark.parametrize("name", sorted(HYBRID2_FAMILIES))
def test_the_config_transformers_to_dict_gives_loads_with_transformers_numbers(
        name: str, tmp_path: Path) -> None:
    """Every attribute transformers' config has (``to_json_string(use_diff=False)``: its own
    writer), beside the same safetensors, gives transformers' logits (< 1e-4, F32)."""
    t = tiny_hybrid2(name)
    text = t.hf.config.to_json_string(use_diff=False)
    assert len(json.loads(text)) > len(json.loads((t.path / "config.json").read_text()))
    d = tmp_path / "to_dict"
    d.mkdir()
    (d / "config.json").write_text(text)
    for f in t.path.glob("*.safetensors"):
        (d / f.name).symlink_to(f)
    ids = torch.randint(3, t.hf.config.vocab_size, (1, 9),
                        generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = t.hf(ids).logits
    got = mi.MIModel.from_pretrained(d).forward(ids).output
    assert (got - want).abs().max().item() < 1e-4
