"""Residual decomposition and direct logit attribution add up (tolerances stated per test)."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    LogitAttribution, accumulated_resid, apply_ln_to_stack, decompose_resid,
    direct_logit_attribution, logit_attrs, run_for_decomposition, stack_head_results,
)
from mi_core.serialize import from_json, to_json


@pytest.fixture(scope="module")
def cache(model):
    return run_for_decomposition(model, "decompose me", heads=True)


def test_components_sum_to_the_final_residual(model, cache):
    stack, labels = decompose_resid(cache, model.num_layers)
    assert labels[:3] == ["embed", "0_attn", "0_mlp"] and len(labels) == 2 * model.num_layers + 1
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    torch.testing.assert_close(stack.sum(0), final, atol=1e-4, rtol=0)


def test_accumulated_resid_labels_and_values(model, cache):
    stack, labels = accumulated_resid(cache, model.num_layers, incl_mid=True)
    assert labels[:3] == ["0_pre", "0_mid", "0_post"]
    torch.testing.assert_close(stack[-1], cache[mi.HookPoint.resid_post(model.num_layers - 1)])


def test_head_results_plus_bias_sum_to_attn_out(model, cache):
    stack, labels = stack_head_results(model, cache, layers=[1])
    assert labels == ["L1H0", "L1H1", "L1H2", "L1H3", "L1_bias"]
    torch.testing.assert_close(stack.sum(0), cache[mi.HookPoint.attn_out(1)], atol=1e-4, rtol=0)


def test_head_results_match_the_captured_hook_result(model):
    ids = model.to_tokens("abc")
    c = model.forward(ids, mi.HookSpec().capture("blocks.0.attn.hook_result").capture("blocks.0.attn.hook_z"))
    via_result, _ = stack_head_results(model, c, layers=[0], include_bias=False)
    c2 = model.forward(ids, mi.HookSpec().capture("blocks.0.attn.hook_z"))
    via_z, _ = stack_head_results(model, c2, layers=[0], include_bias=False)
    torch.testing.assert_close(via_result, via_z, atol=1e-5, rtol=0)


def test_apply_ln_to_stack_is_additive_and_matches_the_final_norm(model, cache):
    stack, _ = decompose_resid(cache, model.num_layers)
    normed = apply_ln_to_stack(model, stack, cache)
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    ref = model.backend.final_norm(final)  # recomputes the scale: independent of the capture
    torch.testing.assert_close(normed.sum(0), ref, atol=1e-4, rtol=0)


def test_logit_attributions_sum_to_the_logit(model, cache):
    stack, _ = decompose_resid(cache, model.num_layers)
    tok, inc = 7, 9
    attrs_ = logit_attrs(model, stack, cache, tok, inc, position=-1)[:, 0]
    out = cache.output[0, -1]
    # the fake model's final norm has no bias and the unembedding no b_U: remainder is 0
    assert float(attrs_.sum()) == pytest.approx(float(out[tok] - out[inc]), abs=1e-4)


def test_dla_per_head_sums_with_remainder_and_round_trips(model):
    r = direct_logit_attribution(model, "decompose me", per_head=True)
    assert r.labels[0] == "embed" and "L2H3" in r.labels and r.labels[-1] == "2_mlp"
    assert sum(r.values) + r.remainder == pytest.approx(r.total, abs=1e-4)
    assert abs(r.remainder) < 1e-4
    assert from_json(to_json(r), LogitAttribution) == r
    assert len(r.top(3)) == 3


def test_decomposition_needs_attention_points(rwkv_like):
    with pytest.raises(mi.HookError, match="hook_resid_mid|hook_attn_out"):
        run_for_decomposition(rwkv_like, "ab")
