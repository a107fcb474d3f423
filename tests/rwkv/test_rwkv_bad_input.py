"""Bad RWKV checkpoints: each is a typed error whose message names the key / tensor and file.

Configs are strict (no coercion, ranges and relations checked, unknown keys refused) and
every tensor is accounted for (leftovers, missing, integer and non-finite tensors named).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from tests.support import rwkv_ckpt
from tests.support.bad_files import write_pickle_payload
from tests.support.rwkv_ckpt import HEAD, HIDDEN, LAYERS, VOCAB

import mi_core as mi

DELETE = object()


def _edit_config(src: Path, dst: Path, **changes: Any) -> Path:
    """A copy of checkpoint `src` whose config.json has `changes` (DELETE removes a key)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in changes.items():
        if v is DELETE:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _edit_tensors(src: Path, dst: Path, edit: Any) -> Path:
    """A copy of checkpoint `src` whose tensors dict went through `edit(tensors)`."""
    shutil.copytree(src, dst)
    w = load_file(str(dst / "model.safetensors"))
    edit(w)
    save_file(w, str(dst / "model.safetensors"))
    return dst


# -- config: types, no coercion -----------------------------------------------------------

@pytest.mark.parametrize("version, key, value", [
    ("v6", "tie_word_embeddings", "false"),   # a string is not a boolean (would tie the head)
    ("v6", "num_hidden_layers", 2.7),         # not silently 2
    ("v6", "hidden_size", "128"),
    ("v6", "layer_norm_epsilon", "1e-5"),
    ("v6", "head_size", True),                # bool is not an integer
    ("v7", "num_hidden_layers", 2.0),
    ("v7", "norm_eps", [1e-5]),
    ("v7", "tie_word_embeddings", 0),
    ("v7", "intermediate_size", 512.5),
])
def test_wrongly_typed_config_value_is_a_config_error_naming_key_value_and_file(
        version: str, key: str, value: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    d = _edit_config(request.getfixturevalue(f"{version}_dir"), tmp_path / "m", **{key: value})
    with pytest.raises(mi.ConfigError) as err:
        mi.MIModel.from_pretrained(d)
    msg = str(err.value)
    assert f"'{key}'" in msg and repr(value) in msg and str(d / "config.json") in msg, msg


# -- config: ranges and relations ---------------------------------------------------------

@pytest.mark.parametrize("version, key, value, why", [
    ("v6", "hidden_size", 0, ">= 1"),
    ("v6", "vocab_size", -5, ">= 1"),
    ("v6", "layer_norm_epsilon", -1e-5, "> 0"),
    ("v6", "layer_norm_epsilon", 0, "> 0"),
    ("v6", "head_size_divisor", 0, "> 0"),
    ("v6", "attention_hidden_size", 64, "not supported"),
    ("v6", "eos_token_id", -1, ">= 0"),
    ("v7", "norm_eps", -1e-5, "> 0"),  # (Infinity is refused earlier: not valid JSON)
    ("v7", "hidden_ratio", -4.0, "> 0"),
    ("v7", "num_heads", 3, "!= hidden_size / head_dim"),
    ("v7", "head_dim", 48, "does not divide"),
    ("v7", "num_attention_heads", 4, "!= num_heads"),
    ("v7", "hidden_ratio", 1e308, "MLP width of inf"),
    ("v6", "head_size_divisor", 1e200, "overflows"),
])
def test_out_of_range_config_value_is_a_config_error(version: str, key: str, value: Any, why: str,
                                                     tmp_path: Path, request: pytest.FixtureRequest) -> None:
    changes = {key: value} | ({"intermediate_size": None} if key == "hidden_ratio" else {})
    d = _edit_config(request.getfixturevalue(f"{version}_dir"), tmp_path / "m", **changes)
    with pytest.raises(mi.ConfigError) as err:
        mi.MIModel.from_pretrained(d)
    msg = str(err.value)
    assert f"'{key}'" in msg and why in msg and "config.json" in msg, msg


def test_missing_required_key_is_named(v6_dir: Path, tmp_path: Path) -> None:
    d = _edit_config(v6_dir, tmp_path / "m", vocab_size=DELETE)
    with pytest.raises(mi.ConfigError, match=r"config\.json: required key 'vocab_size' is missing"):
        mi.MIModel.from_pretrained(d)


# -- config: keys that change the numbers are implemented or refused ----------------------

@pytest.mark.parametrize("key, value", [
    ("norm_bias", False), ("norm_first", False), ("hidden_act", "gelu"),
    ("attn", {"layers": [1], "num_heads": 2}), ("value_dim", [64, 64]),
])
def test_rwkv7_key_we_do_not_implement_is_refused(key: str, value: Any, v7_dir: Path,
                                                  tmp_path: Path) -> None:
    d = _edit_config(v7_dir, tmp_path / "m", **{key: value})
    with pytest.raises(mi.ConfigError, match=rf"config\.json: key '{key}'"):
        mi.MIModel.from_pretrained(d)


def test_rwkv7_accepts_the_values_it_implements_for_those_keys(v7_dir: Path, tmp_path: Path) -> None:
    d = _edit_config(v7_dir, tmp_path / "m", norm_first=True, hidden_act="sqrelu", attn=None,
                     value_dim=[HIDDEN] * LAYERS, fuse_norm=True, attn_mode="chunk")
    assert mi.MIModel.from_pretrained(d).num_layers == LAYERS


@pytest.mark.parametrize("version", ["v6", "v7"])
def test_unknown_config_key_is_refused_by_name(version: str, tmp_path: Path,
                                               request: pytest.FixtureRequest) -> None:
    d = _edit_config(request.getfixturevalue(f"{version}_dir"), tmp_path / "m",
                     logits_multiplier=0.5)
    with pytest.raises(mi.ConfigError, match=r"config\.json: unknown RWKV-\d key\(s\) \['logits_multiplier'\]"):
        mi.MIModel.from_pretrained(d)
    assert "logits_multiplier" in mi.check_compatibility(d).summary()


def test_lora_rank_disagreeing_with_the_tensors_is_refused(v7_dir: Path, tmp_path: Path) -> None:
    d = _edit_config(v7_dir, tmp_path / "m", decay_low_rank_dim=48)  # tensors have rank 32
    with pytest.raises(mi.ConfigError, match=r"'decay_low_rank_dim' = 48.*w_lora\.lora\.0\.weight has rank 32"):
        mi.MIModel.from_pretrained(d)


def test_rwkv_config_built_directly_is_validated_too() -> None:
    with pytest.raises(mi.ConfigError, match=r"RwkvConfig\.norm_eps = -1"):
        from mi_rwkv.config import RwkvConfig
        RwkvConfig(version=6, vocab_size=10, hidden_size=8, num_layers=1, head_dim=8, num_heads=1,
                   intermediate_size=16, norm_eps=-1, group_norm_eps=1e-5)


# -- weights: every tensor accounted for --------------------------------------------------

def test_config_with_fewer_layers_than_the_checkpoint_names_the_leftover_tensors(
        v6_dir: Path, tmp_path: Path) -> None:
    d = _edit_config(v6_dir, tmp_path / "m", num_hidden_layers=1)
    with pytest.raises(mi.WeightLoadError,
                       match=r"num_hidden_layers=1 .*does not use: rwkv\.blocks\.1\.attention"):
        mi.MIModel.from_pretrained(d)


def test_config_with_more_layers_than_the_checkpoint_names_the_missing_tensors(
        v7_dir: Path, tmp_path: Path) -> None:
    d = _edit_config(v7_dir, tmp_path / "m", num_hidden_layers=3)
    with pytest.raises(mi.WeightLoadError, match=r"missing tensors: model\.layers\.2\."):
        mi.MIModel.from_pretrained(d)


def test_unexpected_tensor_is_named(v7_dir: Path, tmp_path: Path) -> None:
    d = _edit_tensors(v7_dir, tmp_path / "m",
                      lambda w: w.update({"model.layers.0.attn.o_proj.bias": torch.zeros(HIDDEN)}))
    with pytest.raises(mi.WeightLoadError, match=r"does not use: model\.layers\.0\.attn\.o_proj\.bias"):
        mi.MIModel.from_pretrained(d)


def test_integer_weights_are_refused_by_name(v6_dir: Path, tmp_path: Path) -> None:
    def to_int(w: dict[str, torch.Tensor]) -> None:
        w["rwkv.blocks.1.attention.key.weight"] = w["rwkv.blocks.1.attention.key.weight"].to(torch.int8)

    d = _edit_tensors(v6_dir, tmp_path / "m", to_int)
    with pytest.raises(mi.WeightLoadError, match=r"non-float tensors rwkv\.blocks\.1\.attention\.key\.weight \(I8\)"):
        mi.MIModel.from_pretrained(d)


@pytest.mark.parametrize("version, name, value", [
    ("v6", "rwkv.blocks.0.attention.time_faaaa", float("nan")),
    ("v7", "model.layers.1.ffn.key.weight", float("inf")),
])
def test_non_finite_weights_are_named(version: str, name: str, value: float, tmp_path: Path,
                                      request: pytest.FixtureRequest) -> None:
    def poison(w: dict[str, torch.Tensor]) -> None:
        w[name].view(-1)[3] = value

    d = _edit_tensors(request.getfixturevalue(f"{version}_dir"), tmp_path / "m", poison)
    with pytest.raises(mi.WeightLoadError, match=rf"NaN or inf.*{name.replace('.', chr(92) + '.')}"):
        mi.MIModel.from_pretrained(d)


def test_weight_overflowing_the_requested_dtype_is_named(v7_dir: Path, tmp_path: Path) -> None:
    def big(w: dict[str, torch.Tensor]) -> None:
        w["model.norm.weight"][0] = 1e6  # finite in F32, inf in F16 (max 65504)

    d = _edit_tensors(v7_dir, tmp_path / "m", big)
    assert mi.MIModel.from_pretrained(d).num_layers == LAYERS
    with pytest.raises(mi.WeightLoadError, match=r"NaN or inf values \(in torch\.float16\): model\.norm\.weight"):
        mi.MIModel.from_pretrained(d, dtype=torch.float16)


def test_tied_config_with_a_different_stored_head_is_refused(v6_dir: Path, tmp_path: Path) -> None:
    d = _edit_config(v6_dir, tmp_path / "m", tie_word_embeddings=True)
    with pytest.raises(mi.WeightLoadError, match=r"tie_word_embeddings: true.*'head\.weight' differs"):
        mi.MIModel.from_pretrained(d)


def test_pickled_checkpoint_is_refused_without_unpickling(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    marker = tmp_path / "unpickled"
    (d / "config.json").write_text(json.dumps(rwkv_ckpt.v6_config(LAYERS, HIDDEN, HEAD, VOCAB)))
    for name in ("pytorch_model.bin", "model.pth"):
        write_pickle_payload(d / name, marker)
    # the core refuses pickle-only checkpoints before any plugin looks at them
    for backend in (None, "rwkv6"):
        with pytest.raises(mi.WeightLoadError, match=r"pickle.*refused"):
            mi.MIModel.from_pretrained(d, backend=backend)
    assert not marker.exists()


# -- fuzzing: every failure of config parsing is an MIError -----------------------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=True)
                     | st.sampled_from([1e308, -0.0, 5e-324, 2 ** 40])
                     | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                     max_leaves=5)


@st.composite
def _configs(draw: Any) -> tuple[int, Any]:
    """(version, config): a valid tiny config with 0-3 keys (read, harmless or unknown) set
    to random JSON, or (a fifth) any JSON value."""
    from mi_rwkv.config import V6_HARMLESS, V6_READ, V7_HARMLESS, V7_READ

    version = draw(st.sampled_from([6, 7]))
    if draw(st.integers(0, 4)) == 0:
        return version, draw(_JSON)
    cfg = (rwkv_ckpt.v6_config if version == 6 else rwkv_ckpt.v7_config)(1, 128, 64, 50)
    keys = list(V6_READ + V6_HARMLESS if version == 6 else V7_READ + V7_HARMLESS) + ["unknown_key"]
    for k in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
        cfg[k] = draw(_JSON)
    return version, cfg


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_configs())
def test_fuzzed_rwkv_config_parses_or_raises_an_mi_error(case: tuple[int, Any]) -> None:
    from mi_rwkv.config import parse_v6, parse_v7

    version, raw = case
    try:
        cfg = (parse_v6 if version == 6 else parse_v7)(raw if isinstance(raw, dict) else {}, {}, "fuzz/config.json")
    except mi.MIError:
        return
    assert cfg.num_heads * cfg.head_dim == cfg.hidden_size and cfg.norm_eps > 0


def test_generic_transformers_keys_are_harmless_only_at_their_default(v6_dir: Path, tmp_path: Path) -> None:
    d = _edit_config(v6_dir, tmp_path / "ok", attention_dropout=0.1, max_length=20,
                     is_encoder_decoder=False)
    assert mi.MIModel.from_pretrained(d).num_layers == LAYERS
    d = _edit_config(v6_dir, tmp_path / "bad", is_encoder_decoder=True)
    with pytest.raises(mi.ConfigError, match=r"unknown RWKV-6 key\(s\) \['is_encoder_decoder'\]"):
        mi.MIModel.from_pretrained(d)


def test_generic_metadata_is_harmless_as_for_every_plugin(v6_dir: Path, tmp_path: Path) -> None:
    """The same generic policy as mi-transformer's: token ids, export markers and
    _-prefixed metadata cannot change the numbers (mi_core.configread.is_generic_harmless)."""
    d = _edit_config(v6_dir, tmp_path / "ok", unk_token_id=0, _model_name_or_path="x",
                     **{"transformers.js_config": {"kv_cache_dtype": {}}})
    assert mi.MIModel.from_pretrained(d).num_layers == LAYERS
