"""Strict configs and accounted-for weights: every bad input is a typed MIError naming the
culprit (key, value and file; tensor and file), never a silent coercion or a raw Python error.

Configs are the tiny checkpoints' own config.json (written by transformers) with one edit.
The last tests fuzz config parsing and the forward with `hypothesis`: random but plausible
edits of real configs either parse or raise an MIError, and a config that parses builds a
model whose forward either runs or raises an MIError.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mi_core as mi
from mi_core.errors import ConfigError, MIError, WeightLoadError
from mi_transformer import plugin
from mi_transformer.config import FAMILIES, UnknownKeysError, parse_config
from mi_transformer.loader import from_tensors
from mi_transformer.weights import tensor_table
from tests.support.checkpoint_variants import load_direct, source_of, variant

SRC = "ckpt/config.json"


def _edit(cfg: dict, **changes: Any) -> dict:
    out = dict(cfg)
    for k, v in changes.items():
        if v is _DROP:
            out.pop(k, None)
        else:
            out[k] = v
    return out


_DROP = object()

# (tiny family, edits, regexes the ConfigError message must contain). Each names the key and
# its value (and the file: checked for all below).
CONFIG_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("qwen2_untied", {"tie_word_embeddings": "false"}, ["tie_word_embeddings", "'false'"]),
    ("llama", {"num_hidden_layers": 2.7}, ["num_hidden_layers", "2.7"]),
    ("llama", {"num_hidden_layers": 3.0}, ["num_hidden_layers", "3.0"]),
    ("llama", {"num_hidden_layers": True}, ["num_hidden_layers", "True"]),
    ("llama", {"hidden_size": 0}, ["hidden_size", "0"]),
    ("llama", {"hidden_size": -64}, ["hidden_size", "-64"]),
    ("llama", {"vocab_size": "128"}, ["vocab_size", "'128'"]),
    ("llama", {"vocab_size": _DROP}, ["vocab_size", "missing"]),
    ("llama", {"num_attention_heads": 3, "head_dim": _DROP}, ["num_attention_heads", "3"]),
    ("llama", {"num_key_value_heads": 3}, ["num_key_value_heads", "3"]),
    ("llama", {"num_key_value_heads": 0}, ["num_key_value_heads", "0"]),
    ("llama", {"rms_norm_eps": -1e-6}, ["rms_norm_eps", "-1e-06"]),
    ("llama", {"rms_norm_eps": 0}, ["rms_norm_eps", "0"]),
    ("llama", {"rms_norm_eps": "1e-6"}, ["rms_norm_eps", "'1e-6'"]),
    ("llama", {"rms_norm_eps": math.nan}, ["rms_norm_eps", "nan"]),
    ("llama", {"hidden_act": "relu6"}, ["hidden_act", "relu6"]),
    ("llama", {"attention_bias": 1}, ["attention_bias", "1"]),
    ("llama", {"model_type": 5}, ["model_type", "5"]),
    ("llama", {"rope_parameters": [10000.0]}, ["rope_parameters", "10000"]),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}},
     ["low_freq_factor", "missing"]),
    ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, ["factor"]),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": -2.0, "rope_theta": 1e4}},
     ["factor", "-2.0"]),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "beta": 2}},
     ["beta"]),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
     ["rope_theta", "0"]),
    ("llama", {"rope_parameters": {"rope_type": "ntk_magic", "rope_theta": 1e4}}, ["ntk_magic"]),
    ("llama", {"partial_rotary_factor": 1.5}, ["partial_rotary_factor", "1.5"]),
    ("mistral", {"sliding_window": 0}, ["sliding_window", "0"]),
    ("mistral", {"sliding_window": 2.5}, ["sliding_window", "2.5"]),
    ("gemma2", {"attn_logit_softcapping": -1.0}, ["attn_logit_softcapping", "-1.0"]),
    ("gemma3_text", {"layer_types": ["full_attention"]}, ["layer_types", "1 entries"]),
    ("gemma3_text", {"layer_types": ["full_attention", "chunked", "full_attention"]},
     ["layer_types", "chunked"]),
    ("gemma3_text", {"use_bidirectional_attention": True}, ["use_bidirectional_attention"]),
    ("qwen2_untied", {"max_window_layers": -1}, ["max_window_layers", "-1"]),
    ("gpt2", {"n_ctx": 128}, ["n_ctx", "n_positions"]),
    ("gpt2", {"n_positions": None}, ["n_positions", "missing"]),
    ("gpt2", {"scale_attn_weights": "yes"}, ["scale_attn_weights", "'yes'"]),
    ("gptj", {"rotary_dim": 7}, ["rotary_dim", "7"]),
    ("gptj", {"rotary_dim": 32}, ["rotary_dim", "32"]),
    ("gpt_neox", {"rotary_pct": 0.25}, ["rotary_pct", "disagree"]),
    ("gpt_neox", {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                      "partial_rotary_factor": 0.1}}, ["0.1", "rotated dims"]),
    ("gpt_neox", {"use_parallel_residual": "true"}, ["use_parallel_residual", "'true'"]),
    ("phi", {"qk_layernorm": True}, ["qk_layernorm", "True"]),
    ("stablelm", {"qk_layernorm": "yes"}, ["qk_layernorm", "'yes'"]),
    ("opt", {"do_layer_norm_before": False}, ["do_layer_norm_before", "False"]),
    ("opt", {"word_embed_proj_dim": 32}, ["word_embed_proj_dim", "32"]),
    ("opt", {"_remove_final_layer_norm": True}, ["_remove_final_layer_norm"]),
    ("opt", {"layer_norm_elementwise_affine": False}, ["layer_norm_elementwise_affine"]),
    ("falcon_7b", {"alibi": True}, ["alibi", "True"]),
    ("phi3", {"attention_bias": True}, ["attention_bias", "True"]),
    ("gemma2", {"sliding_window_size": 7}, ["sliding_window_size", "7"]),
    ("falcon_new_decoder", {"num_kv_heads": 3}, ["num_kv_heads", "3"]),
    ("falcon_new_decoder", {"parallel_attn": False}, ["parallel_attn"]),
    ("falcon_7b", {"num_ln_in_parallel_attn": 2}, ["num_ln_in_parallel_attn", "2"]),
    ("falcon_new_decoder", {"num_ln_in_parallel_attn": 3}, ["num_ln_in_parallel_attn", "3"]),
]


@pytest.mark.parametrize("name, changes, expect", CONFIG_CASES,
                         ids=[f"{n}-{'-'.join(c)}" for n, c, _ in CONFIG_CASES])
def test_bad_config_value_is_a_config_error_naming_key_value_and_file(tiny, name, changes,
                                                                      expect):
    cfg = _edit(tiny(name).config, **changes)
    with pytest.raises(ConfigError) as e:
        parse_config(cfg, SRC)
    for pattern in [SRC, *expect]:
        assert pattern in str(e.value), (pattern, str(e.value))


@pytest.mark.parametrize("name, key, value", [
    ("llama", "embedding_multiplier", 12.0),  # Granite's: changes the numbers
    ("llama", "no_rope_layers", [1, 0, 1]),  # SmolLM3's NoPE layers
    ("gpt2", "rotary_dim", 8),  # a GPT-J key on GPT-2
    ("gpt_neox", "is_encoder_decoder", True),
    ("opt", "scale_embedding", True),
    ("opt", "layer_norm_eps", 1e-3),  # OPT's LayerNorms use 1e-5 whatever the config says
    ("falcon_7b", "logits_scaling", 2.0),
])
def test_unknown_key_of_a_known_family_is_refused_by_name(tiny, name, key, value):
    cfg = _edit(tiny(name).config, **{key: value})
    with pytest.raises(UnknownKeysError, match=key) as e:
        parse_config(cfg, SRC)
    assert e.value.keys == [key] and SRC in str(e.value)


def test_hub_configs_with_their_historical_keys_parse(tiny):
    """Keys found in the hub's own config.json files that do not change the numbers:
    GPT-2 medium's GPT-1 leftovers, GPT-J 6B's `rotary` / `scale_attn_weights`, Falcon-7B's
    `auto_map` and `apply_residual_connection_post_layernorm: false`, Phi-3's
    `attention_bias: false`, Gemma 2's `sliding_window_size` repeating `sliding_window`."""
    extra = {"gpt2": {"n_special": 0, "predict_special_tokens": True, "n_ctx": 64,
                      "summary_type": "cls_index", "task_specific_params": {"x": {}}},
             "gptj": {"rotary": True, "scale_attn_weights": True, "summary_use_proj": True},
             "falcon_7b": {"auto_map": {"AutoConfig": "configuration_falcon.FalconConfig"},
                           "apply_residual_connection_post_layernorm": False},
             "phi3": {"attention_bias": False},
             "gemma2": {"sliding_window_size": 5, "cache_implementation": "hybrid"}}
    for name, keys in extra.items():
        cfg = tiny(name).config
        assert parse_config(_edit(cfg, **keys), SRC) == parse_config(cfg, SRC)
    with pytest.raises(ConfigError, match="apply_residual_connection_post_layernorm"):
        parse_config(_edit(tiny("falcon_7b").config,
                           apply_residual_connection_post_layernorm=True), SRC)


def test_custom_code_of_an_unknown_model_type_is_refused(tiny):
    cfg = _edit(tiny("llama").config, model_type="my_llama",
                auto_map={"AutoModelForCausalLM": "modeling_mine.MyLlama"})
    with pytest.raises(UnknownKeysError, match="auto_map"):
        parse_config(cfg, SRC)


def test_null_valued_and_generic_keys_are_harmless(tiny):
    cfg = _edit(tiny("llama").config, sliding_window=None, architectures=["LlamaForCausalLM"],
                torch_dtype="bfloat16", attention_dropout=0.1, id2label={"0": "a"})
    assert parse_config(cfg, SRC) == parse_config(tiny("llama").config, SRC)


@pytest.mark.parametrize("model_type, extra", [
    ("granite", {"embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                 "attention_multiplier": 0.015625, "logits_scaling": 8.0}),
    ("smollm3", {"no_rope_layers": [1, 1, 0], "no_rope_layer_interval": 4}),
])
def test_unknown_model_type_with_keys_that_change_the_numbers_is_unsupported(tiny, tmp_path,
                                                                             model_type, extra):
    """Auto-config would have run these as LLaMA; the report names the keys it refused.
    (model_type renamed so that no family claims it.)"""
    path = variant(tiny("llama").path, tmp_path / model_type,
                    lambda c: c.update(model_type=f"my_{model_type}", **extra))
    d = plugin.mi_detect_backend(source=source_of(path))
    assert d.score == 0 and sorted(d.config_keys) == sorted(extra)
    report = mi.check_compatibility(path)
    assert not report.supported
    for key in extra:
        assert key in report.summary()
    with pytest.raises(UnknownKeysError, match=next(iter(extra))):
        load_direct(path)


def test_known_family_with_an_unknown_key_is_not_detected_as_supported(tiny, tmp_path):
    path = variant(tiny("gpt2").path, tmp_path / "g", lambda c: c.update(magic_scale=2.0))
    d = plugin.mi_detect_backend(source=source_of(path))
    assert d.score == 0 and d.config_keys == ["magic_scale"]


# -- weights ---------------------------------------------------------------------------

def _extra_layer(ts: dict) -> None:
    for k in [k for k in ts if k.startswith("model.layers.2.")]:
        ts[k.replace("layers.2.", "layers.3.")] = ts[k].clone()


WEIGHT_CASES: list[tuple[str, str, Callable[[dict], None] | None, Callable[[dict], None] | None,
                         list[str]]] = [
    ("leftover", "llama", None,
     lambda ts: ts.update({"model.layers.0.mlp.extra.weight": torch.zeros(3)}),
     ["unexpected", "model.layers.0.mlp.extra.weight"]),
    ("fewer layers in config", "llama", lambda c: c.update(num_hidden_layers=2), None,
     ["layers up to index 2", "has 2 layers", "model.layers.2.self_attn.q_proj.weight"]),
    ("more layers in checkpoint", "llama", None, _extra_layer,
     ["layers up to index 3", "model.layers.3.mlp.down_proj.weight"]),
    ("missing", "gpt2", None, lambda ts: ts.pop("transformer.wpe.weight"),
     ["missing", "transformer.wpe.weight"]),
    ("misshaped", "gpt_neox", None,
     lambda ts: ts.update({"gpt_neox.layers.1.attention.query_key_value.weight":
                           torch.zeros(64, 64)}),
     ["gpt_neox.layers.1.attention.query_key_value.weight", "[64, 64]", "[192, 64]"]),
    ("int8 weight", "llama", None,
     lambda ts: ts.update({"model.layers.1.self_attn.q_proj.weight":
                           torch.ones(64, 64, dtype=torch.int8)}),
     ["model.layers.1.self_attn.q_proj.weight", "torch.int8"]),
    ("bool weight", "opt", None,
     lambda ts: ts.update({"model.decoder.layers.0.fc1.bias": torch.ones(96, dtype=torch.bool)}),
     ["model.decoder.layers.0.fc1.bias", "torch.bool"]),
    ("nan weight", "falcon_7b", None,
     lambda ts: ts["transformer.h.2.mlp.dense_4h_to_h.weight"].__setitem__((0, 0), math.nan),
     ["transformer.h.2.mlp.dense_4h_to_h.weight", "NaN or inf"]),
    ("inf weight", "phi", None,
     lambda ts: ts["model.final_layernorm.bias"].__setitem__(3, math.inf),
     ["model.final_layernorm.bias", "NaN or inf"]),
    ("tied but the head differs", "qwen2_untied", lambda c: c.update(tie_word_embeddings=True),
     None, ["tie_word_embeddings", "lm_head.weight", "differs"]),
]


@pytest.mark.parametrize("what, name, config_edit, tensor_edit, expect", WEIGHT_CASES,
                         ids=[c[0] for c in WEIGHT_CASES])
def test_weights_are_accounted_for_and_checked(tiny, tmp_path, what, name, config_edit,
                                               tensor_edit, expect):
    path = variant(tiny(name).path, tmp_path / "m", config_edit, tensor_edit)
    with pytest.raises(WeightLoadError) as e:
        load_direct(path)
    for pattern in [str(path), *expect]:
        assert pattern in str(e.value), (pattern, str(e.value))


def test_f32_weight_overflowing_float16_is_named_when_loading_in_float16(tiny, tmp_path):
    def big(ts: dict) -> None:
        ts["model.layers.0.mlp.up_proj.weight"][0, 0] = 1e6  # > float16's max 65504

    path = variant(tiny("llama").path, tmp_path / "big", tensor_edit=big)
    assert load_direct(path).num_layers == 3  # fine in F32
    with pytest.raises(WeightLoadError, match=r"torch.float16\): model.layers.0.mlp.up_proj"):
        load_direct(path, torch.float16)


def test_rotary_buffers_of_old_checkpoints_are_ignorable(tiny, tmp_path):
    path = variant(tiny("gpt_neox").path, tmp_path / "buf", tensor_edit=lambda ts: ts.update({
        "gpt_neox.layers.0.attention.rotary_emb.inv_freq": torch.ones(4),
        "gpt_neox.layers.0.attention.bias": torch.ones(1, 1, 8, 8, dtype=torch.bool),
        "gpt_neox.layers.0.attention.masked_bias": torch.tensor(-1e9)}))
    assert load_direct(path).num_layers == 3


# -- fuzzing ---------------------------------------------------------------------------

_FUZZ_BASES = ["llama", "gemma2", "gemma3_text", "qwen2_untied", "phi3_longrope", "qwen2_yarn",
               "gpt2", "gpt_neox", "gptj", "opt", "falcon_new_decoder", "phi", "stablelm",
               "mixtral", "qwen2_moe", "olmo", "olmo2", "granite", "smollm3", "cohere"]
_KEYS = sorted({k for f in FAMILIES.values() for k in f.reads} | {"foo", "is_encoder_decoder"})
_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 70), st.sampled_from([0, 1, 2, 3, 4, 16, 64]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 1e-5, 2.0]),
    st.text(max_size=6), st.sampled_from(["gelu", "silu", "relu", "default", "linear"]),
    st.lists(st.sampled_from([0, 1, "full_attention", "sliding_attention"]), max_size=4),
    st.dictionaries(st.sampled_from(["rope_type", "type", "factor", "rope_theta",
                                     "partial_rotary_factor", "low_freq_factor"]),
                    st.one_of(st.sampled_from(["default", "linear", "llama3", "yarn"]),
                              st.floats(-1, 10), st.integers(0, 5)), max_size=3),
)
_EDITS = st.lists(st.tuples(st.sampled_from(_KEYS), st.one_of(_VALUES, st.just(_DROP))),
                  min_size=1, max_size=3)


@pytest.fixture(scope="module")
def fuzz_bases(tiny) -> dict[str, dict]:
    return {n: tiny(n).config for n in _FUZZ_BASES}


def _params(cfg) -> int:
    return sum(math.prod(e.shape) for e in tensor_table(cfg).values())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from(_FUZZ_BASES), edits=_EDITS, seed=st.integers(0, 2**16))
def test_fuzzed_configs_parse_or_raise_an_mierror_and_parsed_ones_run(fuzz_bases, base, edits,
                                                                      seed):
    cfg = _edit(fuzz_bases[base], **dict(edits))
    try:
        parsed = parse_config(cfg, SRC)
    except MIError:
        return
    if _params(parsed) > 300_000:
        return  # a plausible but large config: parsing is what is being fuzzed
    g = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(e.shape, generator=g) for name, e in tensor_table(parsed).items()}
    try:
        model = mi.MIModel(from_tensors(cfg, tensors))
        ids = torch.randint(0, parsed.vocab_size, (2, 5), generator=g)
        out = model.forward(ids, attention_mask=torch.tensor([[0, 1, 1, 1, 1], [1] * 5])).output
    except MIError:
        return
    assert out.shape == (2, 5, parsed.vocab_size)


def test_relations_checked_on_the_axes_also_name_the_file(tiny):
    """A relation only TransformerConfig checks (longrope needs one factor per rotated
    frequency) is reported with the file too."""
    cfg = tiny("phi3_longrope").config
    cfg["rope_parameters"] = dict(cfg["rope_parameters"], short_factor=[1.0, 2.0, 3.0])
    with pytest.raises(ConfigError, match="short_factor has 3 entries") as e:
        parse_config(cfg, SRC)
    assert str(e.value).startswith(SRC)
