"""LLaMA-like families with twists (OLMo, OLMo2, Granite, SmolLM3, Cohere, Gemma 3
multimodal) against transformers.

Reference: the tiny random checkpoints of tests/support/tiny_families.py loaded by
transformers (eager attention, F32, multipliers / bases away from their defaults so that a
wrong one shows). Tolerance: max abs diff < 1e-4 on logits, every layer's residual stream and
attention pattern; greedy generation token-for-token equal.
"""

from __future__ import annotations

import copy

import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError
from mi_transformer.config import parse_config
from tests.support.family_checks import assert_left_padding_rows_alone, assert_matches_transformers

FAMILIES = ["olmo", "olmo2", "granite", "smollm3", "smollm3_interval", "cohere",
            "cohere_qk_norm"]


@pytest.mark.parametrize("name", FAMILIES)
def test_family_matches_transformers(tiny, make_ids, name):
    assert_matches_transformers(tiny(name), make_ids(2, 16, seed=31))


@pytest.mark.parametrize("name", FAMILIES)
def test_left_padding_rows_equal_running_alone(loaded, make_ids, name):
    assert_left_padding_rows_alone(loaded(name), [make_ids(1, 14, seed=5)[0],
                                                  make_ids(1, 8, seed=6)[0]])


@pytest.mark.parametrize("name", ["smollm3", "olmo2", "granite", "cohere_qk_norm"])
def test_greedy_generation_equals_transformers(tiny, loaded, make_ids, name):
    """8 prompt + 10 new tokens with the KV cache: past SmolLM3's window on its NoPE layer."""
    t, model = tiny(name), loaded(name)
    ids = make_ids(2, 8, seed=7)
    ours = model.generate(ids, max_new_tokens=10, stop_at_eos=False)
    with torch.no_grad():
        ref = copy.deepcopy(t.hf).generate(ids, attention_mask=torch.ones_like(ids),
                                           max_new_tokens=10, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.tokens, ref)


def test_olmo_clip_qkv_really_clips(loaded, make_ids):
    model = loaded("olmo")
    pts = ["blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_v"]
    cache = model.forward(make_ids(2, 10, seed=3), mi.HookSpec().capture_all(pts))
    for p in pts:  # clip_qkv 0.5 in the tiny config; the unclipped values are larger
        assert cache[p].abs().max().item() == pytest.approx(0.5), p


def test_olmo2_has_post_norms_and_full_width_qk_norms_only(loaded, make_ids):
    model = loaded("olmo2")
    names = {p.name for p in model.hook_points()}
    assert "blocks.0.ln1.hook_scale" not in names and "blocks.0.ln2.hook_scale" not in names
    assert {"blocks.0.ln1_post.hook_scale", "blocks.0.ln2_post.hook_scale",
            "blocks.0.attn.q_ln.hook_scale"} <= names
    cache = model.forward(make_ids(2, 5, seed=4),
                          mi.HookSpec().capture("blocks.0.attn.q_ln.hook_scale"))
    assert cache["blocks.0.attn.q_ln.hook_scale"].shape == (2, 5, 1)  # one norm over all heads
    assert model.backend.hook_shape("blocks.0.attn.q_ln.hook_scale", 2, 5) == (2, 5, 1)


def test_cohere_parallel_block_with_one_shared_norm_and_per_head_qk_norms(loaded, make_ids):
    model = loaded("cohere_qk_norm")
    names = {p.name for p in model.hook_points()}
    assert "blocks.0.hook_resid_mid" not in names and "blocks.0.ln2.hook_scale" not in names
    pts = ["blocks.0.attn.q_ln.hook_scale", "blocks.0.attn.k_ln.hook_scale",
           "blocks.0.hook_resid_pre", "blocks.0.hook_attn_out", "blocks.0.hook_mlp_out",
           "blocks.0.hook_resid_post"]
    cache = model.forward(make_ids(2, 6, seed=8), mi.HookSpec().capture_all(pts))
    assert cache[pts[0]].shape == (2, 6, 4, 1) and cache[pts[1]].shape == (2, 6, 2, 1)
    parallel = cache[pts[2]] + cache[pts[3]] + cache[pts[4]]  # both branches read resid_pre
    assert (parallel - cache[pts[5]]).abs().max().item() < 1e-5
    assert model.backend.w.layers[0].attn.q_norm.weight.shape == (4, 16)


def test_smollm3_nope_layer_has_no_rotary_points(loaded):
    model = loaded("smollm3")  # no_rope_layers [1, 0, 1]
    names = {p.name for p in model.hook_points()}
    assert "blocks.0.attn.hook_rot_q" in names and "blocks.2.attn.hook_rot_k" in names
    assert "blocks.1.attn.hook_rot_q" not in names and "blocks.1.attn.hook_rot_k" not in names
    assert model.config.layer_windows == (None, 5, None)  # the window on the NoPE layer only


def test_smollm3_interval_spelling_gives_every_nth_layer_no_rope(tiny):
    """Without no_rope_layers, every no_rope_layer_interval-th layer has no rotary, as
    transformers' SmolLM3Config builds the list."""
    from transformers import AutoConfig

    cfg = {k: v for k, v in tiny("smollm3_interval").config.items()
           if k not in ("no_rope_layers", "layer_types")}
    ours = parse_config(cfg).layer_use_rope
    hf = AutoConfig.for_model("smollm3", **{k: v for k, v in cfg.items()
                                            if k != "model_type"}).no_rope_layers
    assert ours == tuple(bool(x) for x in hf) == (True, False, True)


@pytest.mark.parametrize("name, bad, match", [
    ("granite", {"logits_scaling": "2.5"}, "logits_scaling"),
    ("granite", {"residual_multiplier": 0}, "residual_multiplier"),
    ("olmo", {"clip_qkv": -1.0}, "clip_qkv"),
    ("smollm3", {"no_rope_layers": [1, 0]}, "no_rope_layers"),
    ("smollm3", {"no_rope_layers": [1, 2, 1]}, "no_rope_layers"),
])
def test_malformed_family_keys_are_config_errors_naming_the_key(tiny, name, bad, match):
    cfg = {**tiny(name).config, **bad}
    with pytest.raises(ConfigError, match=match):
        parse_config(cfg)


# -- Gemma 3 multimodal checkpoints: the language model inside --------------------------------

@pytest.fixture(scope="module")
def gemma3_mm(tmp_path_factory):
    """A tiny Gemma3ForConditionalGeneration (vision tower included) saved the hub way."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from tests.support.tiny_families import VOCAB, WINDOW
    from tests.transformer.conftest import Tiny, _randomise

    text = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB,
                sliding_window=WINDOW, query_pre_attn_scalar=8, max_position_embeddings=64,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                       image_token_index=VOCAB - 1, boi_token_index=VOCAB - 3,
                       eoi_token_index=VOCAB - 2)
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(cfg).eval()
    hf.config._attn_implementation = "eager"
    _randomise(hf, 0)
    path = tmp_path_factory.mktemp("gemma3_mm") / "gemma3_mm"
    hf.save_pretrained(path)
    return Tiny("gemma3_mm", path, hf)


def test_layer_types_follow_the_configs_sliding_and_full_layers(gemma3_mm):
    model = mi.MIModel.from_pretrained(gemma3_mm.path)
    assert model.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert "layer types" in model.capabilities()


def test_gemma3_multimodal_checkpoint_loads_its_language_model(gemma3_mm, make_ids):
    from safetensors import safe_open

    with safe_open(str(gemma3_mm.path / "model.safetensors"), "pt") as f:
        assert any(k.startswith("vision_tower.") for k in f.keys())  # really multimodal
    cache = assert_matches_transformers(gemma3_mm, make_ids(2, 16, seed=33))
    assert cache.output.shape[-1] == gemma3_mm.hf.config.text_config.vocab_size


def test_gemma3_multimodal_left_padding_rows_equal_running_alone(gemma3_mm, make_ids):
    assert_left_padding_rows_alone(gemma3_mm.load(), [make_ids(1, 14, seed=5)[0],
                                                      make_ids(1, 8, seed=6)[0]])


def test_gemma3_hub_style_short_text_config_gets_transformers_defaults():
    """google/gemma-3-4b-it's text_config lists only a few keys; the rest are
    Gemma3TextConfig's defaults, as transformers fills them in."""
    from transformers import Gemma3Config

    text = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024}
    cfg = {"model_type": "gemma3", "text_config": text, "vision_config": {"model_type":
           "siglip_vision_model"}, "mm_tokens_per_image": 256, "image_token_index": 262144}
    ours = parse_config(cfg)
    ref = Gemma3Config(text_config=dict(text)).text_config
    assert (ours.num_heads, ours.num_kv_heads, ours.head_dim, ours.vocab_size) == (
        ref.num_attention_heads, ref.num_key_value_heads, ref.head_dim, ref.vocab_size)
    assert ours.attn_scale == ref.query_pre_attn_scalar ** -0.5
    assert ours.layer_windows[:6] == (1024,) * 5 + (None,)


def test_gemma3_without_text_config_is_a_config_error():
    with pytest.raises(ConfigError, match="text_config"):
        parse_config({"model_type": "gemma3", "vision_config": {}})
