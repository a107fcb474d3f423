"""The 2025-26 families (OLMo-3, EXAONE-4, GLM-4, GLM-4.5, ERNIE-4.5 dense and MoE, Hunyuan
dense, Seed-OSS, Apertus) against transformers.

Reference: the tiny random checkpoints of tests/support/tiny_families_recent.py built and
loaded by transformers (eager attention, F32, unit-scale embeddings, MoE selection biases
randomised). Tolerance: max abs diff < 1e-4 on logits, the embedding, every layer's residual
stream and attention pattern; left-padded rows equal to each row alone (< 1e-4); greedy
generation with the KV cache token-for-token equal to transformers'.
"""

from __future__ import annotations

import copy

import pytest
import torch

import mi_core as mi
from mi_core.interp import (KnockoutSpec, LogitLensAnalysis, SteeringSpec, apply_steering,
                            logit_diff_metric, patching_grid, run_knockout)
from mi_core.interp.decomposition import decompose_resid, run_for_decomposition
from tests.support.family_checks import assert_left_padding_rows_alone
from tests.support.tiny_families_recent import RECENT_FAMILIES

# logits, residual streams and patterns against transformers: test_transformer_parity.py,
# which runs over every tiny family (these included)
FAMILIES = list(RECENT_FAMILIES)

@pytest.mark.parametrize("name", FAMILIES)
def test_left_padding_rows_equal_running_alone(loaded, make_ids, name):
    assert_left_padding_rows_alone(loaded(name), [make_ids(1, 14, seed=5)[0],
                                                  make_ids(1, 8, seed=6)[0]])


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_generation_equals_transformers(tiny, loaded, make_ids, name):
    """8 prompt + 10 new tokens with the KV cache: past the window of 5 on sliding layers."""
    t, model = tiny(name), loaded(name)
    ids = make_ids(2, 8, seed=7)
    ours = model.generate(ids, max_new_tokens=10, stop_at_eos=False)
    with torch.no_grad():
        ref = copy.deepcopy(t.hf).generate(ids, attention_mask=torch.ones_like(ids),
                                           max_new_tokens=10, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.tokens, ref)


@pytest.mark.parametrize("name", FAMILIES)
def test_explicit_and_sdpa_attention_paths_agree(loaded, make_ids, name):
    model, ids = loaded(name), make_ids(2, 12, seed=9)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding: the masked SDPA path too
    a = model.forward(ids, attention_mask=mask, attn_impl="explicit").output
    b = model.forward(ids, attention_mask=mask, attn_impl="sdpa").output
    assert (a - b).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", FAMILIES)
def test_every_hook_point_has_its_documented_shape_and_capturing_changes_nothing(
        loaded, make_ids, name):
    model, ids = loaded(name), make_ids(2, 7, seed=10)
    points = [p.name for p in model.hook_points()]
    cache = model.forward(ids, mi.HookSpec().capture_all(points))
    # capturing hook_result / patterns takes other (equal up to rounding) kernels
    assert (cache.output - model.forward(ids).output).abs().max().item() < 1e-4
    for p in points:
        want = model.backend.hook_shape(p, 2, 7)
        got = tuple(cache[p].shape)
        assert len(got) == len(want) and all(w in (-1, g) for w, g in zip(want, got)), (p, got)


@pytest.mark.parametrize("name", FAMILIES)
def test_every_analysis_runs_and_keeps_its_invariants(loaded, make_ids, name):
    """Knockout and steering change the output; the logit lens' last point is the model's
    output; patching the clean last residual at the last position restores the clean metric
    exactly; the residual decomposition sums to the last residual stream."""
    model = loaded(name)
    ids = make_ids(1, 10, seed=11)
    ko = run_knockout(model, ids, KnockoutSpec(layers=[0, 1]).edge(-1, 7))  # inside windows
    assert (ko.ablated_logits - ko.baseline_logits).abs().max().item() > 1e-3
    steer = SteeringSpec.residual([1], torch.ones(model.backend.hidden_size), 2.0)
    st = apply_steering(model, ids, steer)
    assert (st.steered_logits - st.baseline_logits).abs().max().item() > 1e-3
    probs = torch.softmax(model.forward(ids).output[0, -1], -1)
    top = LogitLensAnalysis(k=1).run(model, ids).points[-1].top[0]
    assert top.token_id == int(probs.argmax()) and abs(top.prob - float(probs.max())) < 1e-5
    corrupted = ids.clone()
    corrupted[0, 4] = 5
    grid = patching_grid(model, ids, corrupted, logit_diff_metric(7, 9), kind="resid_post").grid
    last = grid[-1]
    assert abs(float(last[-1]) - 1.0) < 1e-4 and last[:-1].abs().max().item() < 1e-4
    cache = run_for_decomposition(model, ids)
    stack, labels = decompose_resid(cache, model.num_layers)
    resid = cache[f"blocks.{model.num_layers - 1}.hook_resid_post"]
    assert labels[0] == "embed" and (stack.sum(0) - resid).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", FAMILIES)
def test_transformerlens_layer_names_and_weights(loaded, make_ids, name):
    model = loaded(name)
    _, cache = model.run_with_cache(make_ids(1, 6, seed=12))
    c = model.config
    assert cache["resid_post", c.num_layers - 1].shape == (1, 6, c.hidden_size)
    assert cache["pattern", 0].shape == (1, c.num_heads, 6, 6)
    assert model.W_Q.shape == (c.num_layers, c.num_heads, c.hidden_size, c.head_dim)


@pytest.mark.parametrize("name, types", [
    ("olmo3", ["sliding_attention", "full_attention", "sliding_attention"]),
    ("exaone4", ["sliding_attention", "sliding_attention", "full_attention"]),
    ("exaone4_global", ["full_attention"] * 3),
])
def test_layer_types_follow_the_config(tiny, loaded, name, types):
    model = loaded(name)
    assert model.layer_types == types == list(tiny(name).hf.config.layer_types)
    window = tiny(name).hf.config.sliding_window
    assert model.config.layer_windows == tuple(window if t == "sliding_attention" else None
                                               for t in types)


def test_exaone4_full_layers_have_no_rotary_when_a_window_is_set(loaded):
    names = {p.name for p in loaded("exaone4").hook_points()}
    assert {"blocks.0.attn.hook_rot_q", "blocks.1.attn.hook_rot_k"} <= names
    assert "blocks.2.attn.hook_rot_q" not in names  # the full-attention layer: NoPE
    assert "blocks.2.attn.hook_rot_q" in {p.name for p in loaded("exaone4_global").hook_points()}


def test_hunyuan_qk_norms_read_the_rotated_q_and_k(loaded, make_ids):
    """hook_rot_q / hook_rot_k are what the scores read: after RoPE and after the norms, so
    each head's rotated query, divided by the norm's gain, has RMS 1."""
    model = loaded("hunyuan_v1_dense")
    pts = ["blocks.0.attn.hook_rot_q", "blocks.0.attn.q_ln.hook_scale", "blocks.0.attn.hook_q"]
    cache = model.forward(make_ids(1, 6, seed=13), mi.HookSpec().capture_all(pts))
    gain = model.backend.w.layers[0].attn.q_norm.weight
    rms = (cache[pts[0]] / gain).pow(2).mean(-1).sqrt()
    assert (rms - 1).abs().max().item() < 1e-3
    assert cache[pts[1]].shape == (1, 6, model.config.num_heads, 1)
    order = [p.name for p in model.hook_points() if p.name.startswith("blocks.0.attn.")]
    assert order.index(pts[2]) < order.index(pts[1]) < order.index(pts[0])


@pytest.mark.parametrize("name", FAMILIES)
def test_bfloat16_is_no_worse_than_transformers_in_bfloat16(tiny, make_ids, name):
    """Both in bfloat16 against transformers in float32 on the same weights: our error is at
    most 1.5x transformers' own (OLMo-3's and ERNIE-4.5's rotary in float32, the MoE routers
    in float32, as transformers computes them)."""
    from mi_core.registry import ModelSource
    from mi_transformer.loader import load_backend

    t, ids = tiny(name), make_ids(2, 16, seed=14)
    with torch.no_grad():
        ref = t.hf(ids).logits
        hf_bf16 = copy.deepcopy(t.hf).to(torch.bfloat16)(ids).logits.float()
    be = load_backend(ModelSource(path=t.path), torch.device("cpu"), torch.bfloat16)
    ours = mi.MIModel(be).forward(ids).output.float()
    ours_err, hf_err = (ours - ref).abs().max().item(), (hf_bf16 - ref).abs().max().item()
    assert ours_err <= 1.5 * hf_err, (ours_err, hf_err)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_config_transformers_writes_parses_as_its_saved_file(tiny, name):
    """``to_dict()`` (everything, defaults included) and ``save_pretrained``'s config.json give
    the same axes."""
    from mi_transformer.config import parse_config

    t = tiny(name)
    assert parse_config(t.hf.config.to_dict()) == parse_config(t.config)
