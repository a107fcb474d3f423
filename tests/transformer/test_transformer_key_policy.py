"""The value-aware config key policy: a key the family does not read is accepted at its
neutral value (the one leaving the forward unchanged) and refused, naming the key, the value
and the neutral value, at any other; generic metadata (token ids, export markers,
``_``-prefixed keys) is accepted for every family, except ``_``-prefixed keys some family
reads for its numbers. The neutral tables are data (``Family.neutral``) and are generated
into docs/BACKENDS.md (tests/transformer/test_transformer_docs.py fails on drift)."""

from __future__ import annotations

import pytest

from mi_core.errors import ConfigError
from mi_transformer.config import FAMILIES, ROTARY, ROTARY_DIM, UnknownKeysError, parse_config
from mi_transformer.config.neutral import same_value
from mi_transformer.keytable import key_table_markdown

_LLAMA = {"model_type": "llama", "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 32}
_FALCON = {"model_type": "falcon", "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 1,
           "num_attention_heads": 2, "ffn_hidden_size": 64}
_PHI = {"model_type": "phi", "vocab_size": 32, "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 32, "partial_rotary_factor": 0.5}


@pytest.mark.parametrize("cfg", [
    dict(_LLAMA, rope_interleaved=False),
    dict(_LLAMA, model_type="qwen2", use_mrope=False),
    dict(_PHI, attention_bias=False, rotary_dim=8),  # head_dim 16 x 0.5
    dict(_PHI, rotary_dim=8.0),  # the same number as a JSON float
    dict(_LLAMA, model_type="starcoder2", mlp_type="default", norm_type="layer_norm"),
    dict(_LLAMA, model_type="cohere", rope_interleaved=True),  # interleaved rotary family
    dict(_FALCON, intermediate_size=64, num_key_value_heads=1),  # transformers' GGUF output
    # the keys every rotary family shares (neutral.ROTARY), on families that do not read them
    dict(_LLAMA, model_type="mistral", rope_interleaved=False, use_mrope=False, rotary_dim=8),
    dict(_LLAMA, model_type="qwen3", use_mrope=False, attention_bias=False),
    dict(_LLAMA, model_type="gemma2", head_dim=8, rotary_dim=8, use_mrope=False),
    # Qwen3-Coder-480B-A35B: what transformers' Qwen3-MoE always does, under unread keys
    dict(_LLAMA, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
         moe_intermediate_size=16, use_qk_norm=True, qkv_bias=False,
         shared_expert_intermediate_size=0),
    # StarCoder2-7B: GPTBigCode's leftovers (the eps again, fp32 softmax, 1/sqrt(d) scaling)
    dict(_LLAMA, model_type="starcoder2", norm_epsilon=1e-5, layer_norm_epsilon=1e-5,
         attention_softmax_in_fp32=True, scale_attention_softmax_in_fp32=True,
         scale_attn_weights=True, activation_function="gelu"),
    # EXAONE-4.5's text_config: the q/k norm after the projections; max_window_layers unread
    dict(_LLAMA, model_type="exaone4", sliding_window=4, reorder_qk_norm=True,
         max_window_layers=1),
    # a GLM-4.5-Air derivative's config (a public conversion script's copy): MoE on every
    # layer past first_k_dense_replace, the float32 router transformers always computes
    dict(_LLAMA, model_type="glm4_moe", n_routed_experts=4, num_experts_per_tok=2,
         moe_intermediate_size=16, decoder_sparse_step=1, moe_router_dtype="float32"),
])
def test_key_at_its_neutral_value_is_accepted(cfg):
    parse_config(cfg)


@pytest.mark.parametrize("cfg, key, value, neutral", [
    (dict(_LLAMA, rope_interleaved=True), "rope_interleaved", "True", "False"),
    (dict(_LLAMA, model_type="cohere", rope_interleaved=False), "rope_interleaved", "False",
     "True"),
    (dict(_LLAMA, model_type="qwen2", use_mrope=True), "use_mrope", "True", "False"),
    (dict(_PHI, rotary_dim=16), "rotary_dim", "16", "8"),
    (dict(_PHI, attention_bias=True), "attention_bias", "True", "False"),
    (dict(_LLAMA, model_type="starcoder2", norm_type="rms_norm"), "norm_type", "'rms_norm'",
     "'layer_norm'"),
    # transformers' GGUF conversion repeats Falcon's sizes under LLaMA's names: only the
    # values Falcon's own keys give are accepted (multi-query: 1 KV head)
    (dict(_FALCON, intermediate_size=96), "intermediate_size", "96", "64"),
    (dict(_FALCON, num_key_value_heads=2), "num_key_value_heads", "2", "1"),
    (dict(_LLAMA, model_type="mistral", use_mrope=True), "use_mrope", "True", "False"),
    (dict(_LLAMA, model_type="mistral", rotary_dim=4), "rotary_dim", "4", "8"),
    (dict(_LLAMA, model_type="stablelm", attention_bias=True), "attention_bias",
     "True", "False"),
    (dict(_LLAMA, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=16, shared_expert_intermediate_size=32),
     "shared_expert_intermediate_size", "32", "0"),
    (dict(_LLAMA, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=16, qkv_bias=True), "qkv_bias", "True", "False"),
    (dict(_LLAMA, model_type="starcoder2", norm_epsilon=1e-5, layer_norm_epsilon=1e-6),
     "layer_norm_epsilon", "1e-06", "1e-05"),
    (dict(_LLAMA, model_type="exaone4", sliding_window=4, reorder_qk_norm=False),
     "reorder_qk_norm", "False", "True"),
])
def test_key_at_another_value_is_refused_naming_key_value_and_neutral_value(cfg, key, value,
                                                                          neutral):
    with pytest.raises(ConfigError) as exc:
        parse_config(cfg)
    msg = str(exc.value)
    assert f"{key} = {value}" in msg and f"neutral value {neutral}" in msg, msg
    assert not isinstance(exc.value, UnknownKeysError)


@pytest.mark.parametrize("value", [0, "false", 1.0])
def test_neutral_values_compare_without_coercion(value):
    """0, 1.0 and "false" are not false: refused (JSON types are strict)."""
    with pytest.raises(ConfigError, match="rope_interleaved"):
        parse_config(dict(_LLAMA, rope_interleaved=value))


def test_same_value_is_json_equality():
    assert same_value(False, False) and not same_value(0, False) and not same_value(False, 0)
    assert same_value(32, 32.0) and not same_value(32, 33) and not same_value("32", 32)
    assert same_value([1, 2], (1, 2)) and not same_value([True], (1,))


@pytest.mark.parametrize("key, value", [
    ("unk_token_id", 0), ("image_token_index", 7), ("eot_token_ids", [1, 2]),
    ("_model_name_or_path", "Smollm2 135M"), ("_commit_hash", "abc"),
    ("is_llama_config", True), ("transformers.js_config", {"kv_cache_dtype": {}}),
    ("unsloth_version", "2024.9"),
])
def test_generic_metadata_is_accepted_for_every_family(key, value):
    for mt in ("llama", "qwen3", "gemma2", "falcon", "opt", "gpt2"):
        cfg = _LLAMA if mt in ("llama", "qwen3", "gemma2") else _family_config(mt)
        parse_config(dict(cfg, model_type=mt, **{key: value}))


def _family_config(mt: str) -> dict:
    if mt == "gpt2":
        return {"vocab_size": 32, "n_embd": 16, "n_head": 2, "n_layer": 1, "n_positions": 8}
    if mt == "opt":
        return {"vocab_size": 32, "hidden_size": 16, "num_attention_heads": 2,
                "num_hidden_layers": 1, "ffn_dim": 32, "max_position_embeddings": 8,
                "word_embed_proj_dim": 16}
    return {"vocab_size": 32, "hidden_size": 16, "num_attention_heads": 2,
            "num_hidden_layers": 1}


@pytest.mark.parametrize("key, value", [("_sliding_window_pattern", 6),
                                        ("_remove_final_layer_norm", True)])
def test_private_keys_some_family_reads_for_its_numbers_are_not_generic(key, value):
    with pytest.raises(UnknownKeysError, match=key):
        parse_config(dict(_LLAMA, **{key: value}))


def test_an_unknown_key_is_still_refused_listing_it():
    with pytest.raises(UnknownKeysError, match="use_fancy_attention"):
        parse_config(dict(_LLAMA, use_fancy_attention=True))


def test_every_family_declares_its_neutral_values_and_rotary_ones_the_layout():
    """Each rotary family's table says its rotary layout; families with learned positions
    (GPT-2, OPT) or none (the state-space ones; Jamba's and Nemotron-H's attention has no
    positions) have none, nor has the plugin-internal HookedTransformer(cfg) checkpoint (its
    own rotary_adjacent_pairs key says the layout; no published config carries it)."""
    for mt, f in FAMILIES.items():
        if mt in ("gpt2", "opt", "mamba", "falcon_mamba", "mamba2", "jamba", "nemotron_h",
                  "mi_tl_hooked_transformer"):
            assert "rope_interleaved" not in f.neutral
            continue
        # the GPT-J rotary layout (each parser sets RopeLayout.INTERLEAVED)
        interleaved = mt in ("gptj", "helium", "cohere", "glm", "glm4", "ernie4_5",
                             "ernie4_5_moe", "deepseek_v2", "deepseek_v3", "llama4_text",
                             "llama4")
        assert f.neutral["rope_interleaved"] is interleaved, mt
        assert not set(f.neutral) & f.reads, mt  # a neutral key is one the parser never reads
    assert FAMILIES["phi"].neutral["rotary_dim"] is ROTARY_DIM
    assert set(ROTARY) == {"rope_interleaved", "use_mrope", "rotary_dim", "attention_bias"}


def test_generated_table_shows_neutral_values():
    table = key_table_markdown()
    row = next(line for line in table.splitlines() if line.startswith("| `phi` |"))
    assert "`attention_bias` = `false`" in row and "`rotary_dim` = the rotary width" in row
    assert "`use_mrope` = `false`" in next(
        line for line in table.splitlines() if line.startswith("| `qwen2` |"))


@pytest.mark.parametrize("value, accepted", [("swish", True), ("sigmoid", False)])
def test_qwen3_5_gated_norm_activation_key_is_neutral_only_at_silu(value, accepted):
    """``output_gate_type`` (a 2026 Qwen3.5-MoE export's key, read by transformers' Qwen4-exp
    only): "swish" is the silu transformers' Qwen3.5 gated norm always applies."""
    import json

    from tests.support.published_configs import DIR

    cfg = json.loads((DIR / "Qwen__Qwen3.5-27B.json").read_text())
    cfg["text_config"]["output_gate_type"] = value
    if accepted:
        assert parse_config(cfg).model_type == "qwen3_5"
        return
    with pytest.raises(ConfigError, match="output_gate_type = 'sigmoid'.*neutral value 'swish'"):
        parse_config(cfg)


@pytest.mark.parametrize("key, value", [("moe_router_dtype", "bfloat16"),
                                        ("decoder_sparse_step", 2)])
def test_glm4_moe_router_dtype_and_sparse_step_other_than_transformers_are_refused(key, value):
    cfg = dict(_LLAMA, model_type="glm4_moe", n_routed_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=16, **{key: value})
    with pytest.raises(ConfigError, match=f"{key} = {value!r} is not supported"):
        parse_config(cfg)
