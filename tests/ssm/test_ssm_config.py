"""Config and weight strictness of the state-space families: every key read, known harmless or
refused by name; typed errors for bad values, mis-shaped tensors and a missing mixer plugin;
detection through the plugins."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import mi_core as mi
from mi_core.plugin import get_plugin_manager

from tests.support.ssm_tiny import ssm_ids


def _copy(tiny_ssm, family: str, tmp: Path, **changes: Any) -> Path:
    d = tmp / family
    shutil.copytree(tiny_ssm(family).path, d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("family, changes, match", [
    ("mamba", {"state_size": 8.0}, "state_size"),
    ("mamba", {"use_conv_bias": "true"}, "use_conv_bias"),
    ("mamba", {"hidden_act": "gelu"}, "hidden_act"),
    # (intermediate_size beside expand: transformers builds the intermediate_size-wide mixer;
    # accepted, tests/ssm/test_ssm_published_shapes.py) a mamba_ssm d_inner that disagrees:
    ("mamba", {"d_inner": 48}, "d_inner.*48.*inner width"),
    ("mamba2", {"intermediate_size": 48}, "intermediate_size.*48.*inner width"),
    ("mamba", {"rms_norm": False}, "rms_norm"),
    ("mamba", {"ssm_cfg": {"d_state": 16}}, "ssm_cfg"),
    ("mamba", {"n_layer": 5}, "n_layer"),
    ("mamba", {"some_new_key": 1}, "some_new_key"),
    ("falcon_mamba", {"mixer_rms_eps": 0}, "mixer_rms_eps"),
    ("mamba2", {"num_heads": 4}, r"n_heads \* head_dim|num_heads"),
    ("mamba2", {"n_groups": 3}, "n_groups"),
    ("mamba2", {"time_step_limit": [0.5, 0.1]}, "time_step_limit"),
    ("mamba2", {"time_step_limit": [0.0]}, "time_step_limit"),
])
def test_a_bad_or_unknown_config_value_is_a_config_error_naming_the_key(
        tiny_ssm, tmp_path: Path, family: str, changes: dict[str, Any], match: str) -> None:
    d = _copy(tiny_ssm, family, tmp_path, **changes)
    with pytest.raises(mi.ConfigError, match=match):
        mi.MIModel.from_pretrained(d, backend="transformer")
    report = mi.check_compatibility(d)
    assert not report.supported


@pytest.mark.parametrize("family, changes", [
    ("mamba", {"fused_add_norm": True, "pad_vocab_size_multiple": 8, "rms_norm": True,
               "ssm_cfg": {}, "n_layer": 2, "time_step_rank": "auto"}),
    ("mamba2", {"time_step_limit": [0.0, {"__float__": "Infinity"}], "chunk_size": 4,
                "time_step_rank": 7, "rms_norm": True}),
    ("mamba2", {"time_step_limit": [0.0, 1e30]}),
])
def test_hub_leftovers_and_harmless_keys_load_with_the_same_numbers(
        tiny_ssm, ssm_model, tmp_path: Path, family: str, changes: dict[str, Any]) -> None:
    d = _copy(tiny_ssm, family, tmp_path, **changes)
    if changes.get("time_step_rank") == "auto":  # ceil(32 / 16) = 2 != the checkpoint's 4
        with pytest.raises(mi.WeightLoadError, match="x_proj"):
            mi.MIModel.from_pretrained(d)
        return
    ids = ssm_ids(1, 9)
    ours = mi.MIModel.from_pretrained(d).forward(ids).output
    assert (ours - ssm_model(family).forward(ids).output).abs().max().item() < 1e-4


def test_a_dt_limit_that_clamps_changes_the_numbers_as_transformers_does(tiny_ssm,
                                                                        tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    d = _copy(tiny_ssm, "mamba2", tmp_path, time_step_limit=[0.3, 0.6])
    hf = AutoModelForCausalLM.from_pretrained(d).eval()
    ids = ssm_ids(1, 12)
    with torch.no_grad():
        ref = hf(ids).logits
    ours = mi.MIModel.from_pretrained(d).forward(ids).output
    assert (ours - ref).abs().max().item() < 1e-4


def test_a_mis_shaped_or_missing_mixer_tensor_is_a_weight_load_error(tiny_ssm,
                                                                     tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    d = _copy(tiny_ssm, "mamba2", tmp_path)
    w = load_file(d / "model.safetensors")
    w["backbone.layers.1.mixer.A_log"] = w["backbone.layers.1.mixer.A_log"][:4].clone()
    del w["backbone.layers.0.mixer.dt_bias"]
    save_file(w, d / "model.safetensors")
    with pytest.raises(mi.WeightLoadError, match=r"layers\.0\.mixer\.dt_bias.*layers\.1\.mixer"
                                                 r"\.A_log: \[4\] != expected \[8\]"):
        mi.MIModel.from_pretrained(d)


def test_without_the_mixer_plugin_the_family_is_refused_saying_what_to_install(
        tiny_ssm) -> None:
    pm = get_plugin_manager()
    plugin = pm.get_plugin("ssm")
    pm.unregister(name="ssm")
    try:
        with pytest.raises(mi.UnsupportedModelError, match=r"sequence mixer 'mamba2'.*"
                                                          r"mi-core\[ssm\]"):
            mi.MIModel.from_pretrained(tiny_ssm("mamba2").path, backend="transformer")
        report = mi.check_compatibility(tiny_ssm("mamba2").path)
        assert not report.supported and "mi-core[ssm]" in report.summary()
    finally:
        pm.register(plugin, name="ssm")


def test_detection_picks_the_transformer_backend_with_the_ssm_mixer(tiny_ssm) -> None:
    report = mi.check_compatibility(tiny_ssm("mamba").path)
    assert report.supported and report.backend == "transformer"
    model = mi.MIModel.from_pretrained(tiny_ssm("mamba").path)
    assert "state interventions" in model.capabilities() and "layer types" in model.capabilities()


def test_weight_access_and_processing_refuse_what_a_mixer_layer_lacks(ssm_model) -> None:
    model = ssm_model("mamba")
    assert tuple(model.backend.get_weight("W_U").shape) == (32, 64)
    with pytest.raises(mi.WeightLoadError, match="layer 0 is a 'mamba' layer without attention"):
        model.backend.get_weight("W_Q", 0)
    with pytest.raises(mi.MIError, match="sequence mixer"):
        model.backend.process_weights(fold_ln=True, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=False)


def test_the_config_transformers_to_dict_gives_loads_with_transformers_numbers(
        family, tiny_ssm, tmp_path: Path) -> None:
    """Every attribute transformers' config has (defaults included, as ``to_dict()`` gives
    them, written by transformers' own JSON writer: Mamba-2's infinite dt limit as it spells
    it), beside the same safetensors: transformers' logits (< 1e-4, F32)."""
    t = tiny_ssm(family)
    text = t.hf.config.to_json_string(use_diff=False)
    assert set(json.loads(text)) >= set(t.hf.config.to_dict())
    assert len(t.hf.config.to_dict()) > len(json.loads((t.path / "config.json").read_text()))
    d = tmp_path / "to_dict"
    d.mkdir()
    (d / "config.json").write_text(text)
    (d / "model.safetensors").symlink_to(t.path / "model.safetensors")
    ids = ssm_ids(1, 9, seed=4)
    with torch.no_grad():
        want = t.hf(ids).logits
    got = mi.MIModel.from_pretrained(d).forward(ids).output
    assert (got - want).abs().max().item() < 1e-4
