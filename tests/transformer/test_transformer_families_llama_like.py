"""LLaMA-like families with twists (OLMo, OLMo2, Granite, SmolLM3) against transformers.

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

FAMILIES = ["olmo", "olmo2", "granite", "smollm3", "smollm3_interval"]


@pytest.fixture(scope="module")
def loaded(tiny):
    cache: dict[str, mi.MIModel] = {}

    def get(name: str) -> mi.MIModel:
        if name not in cache:
            cache[name] = tiny(name).load()
        return cache[name]

    return get


@pytest.mark.parametrize("name", FAMILIES)
def test_family_matches_transformers(tiny, make_ids, name):
    assert_matches_transformers(tiny(name), make_ids(2, 16, seed=31))


@pytest.mark.parametrize("name", FAMILIES)
def test_left_padding_rows_equal_running_alone(loaded, make_ids, name):
    assert_left_padding_rows_alone(loaded(name), [make_ids(1, 14, seed=5)[0],
                                                  make_ids(1, 8, seed=6)[0]])


@pytest.mark.parametrize("name", ["smollm3", "olmo2", "granite"])
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
