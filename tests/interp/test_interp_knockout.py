"""Knockout masks, knockout runs, ablation results, mean / resample ablation."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    AblationResult, KnockoutSpec, create_knockout_mask, knockout_hooks, mean_ablation_hooks,
    resample_ablation_hooks, run_knockout,
)
from mi_core.serialize import from_json, to_json


def test_mask_marks_exactly_the_requested_edges_and_heads():
    spec = KnockoutSpec(heads=[1]).edge(-1, 0).edge(2, 1)
    m = create_knockout_mask(spec, n_heads=3, seq_len=4)
    assert m.shape == (1, 3, 4, 4)
    removed = (m == float("-inf")).nonzero().tolist()
    assert removed == [[0, 1, 2, 1], [0, 1, 3, 0]]
    assert (m[m != float("-inf")] == 0).all()


def test_mask_from_to_is_the_cross_product():
    m = create_knockout_mask(KnockoutSpec(from_positions=[2, 3], to_positions=[0, 1]), 2, 4)
    assert int((m == float("-inf")).sum()) == 2 * 2 * 2


def test_mask_is_cached_per_spec():
    spec = KnockoutSpec(layers=[0]).edge(1, 0)
    assert create_knockout_mask(spec, 2, 5) is create_knockout_mask(KnockoutSpec(layers=[0]).edge(1, 0), 2, 5)
    assert create_knockout_mask(spec, 2, 6) is not create_knockout_mask(spec, 2, 5)


@pytest.mark.parametrize("spec", [KnockoutSpec().edge(7, 0), KnockoutSpec().edge(0, -9),
                                  KnockoutSpec(heads=[4]).edge(1, 0),
                                  KnockoutSpec(to_positions=[5])])
def test_out_of_range_position_or_head_is_an_intervention_error(spec):
    with pytest.raises(mi.InterventionError, match="out of range"):
        create_knockout_mask(spec, n_heads=4, seq_len=5)


def test_empty_spec_is_an_error():
    with pytest.raises(mi.InterventionError, match="removes nothing"):
        create_knockout_mask(KnockoutSpec(), 2, 3)


def test_layer_out_of_range_is_a_hook_error(model):
    with pytest.raises(mi.HookError, match="layer 9 out of range"):
        knockout_hooks(model, KnockoutSpec(layers=[9]).edge(1, 0), 4)


def test_knocked_out_pattern_equals_softmax_without_that_key(model):
    """Reference: softmax of the baseline scores with the edge removed, renormalised."""
    ids = model.to_tokens("abcdef")
    s = ids.shape[1]
    hp_s, hp_p = mi.HookPoint.attn_scores(1), mi.HookPoint.attn_pattern(1)
    base = model.forward(ids, mi.HookSpec().capture(hp_s))[hp_s]
    hooks = knockout_hooks(model, KnockoutSpec(layers=[1], heads=[2]).edge(-1, 0), s)
    pat = model.forward(ids, hooks.capture(hp_p))[hp_p]
    ref_scores = base.clone()
    ref_scores[0, 2, -1, 0] = float("-inf")
    ref = torch.softmax(ref_scores, -1)
    torch.testing.assert_close(pat, ref, atol=1e-6, rtol=0)
    assert float(pat[0, 2, -1, 0]) == 0.0


def test_knockout_of_all_keys_gives_zero_not_nan(model):
    ids = model.to_tokens("hello")
    s = ids.shape[1]
    spec = KnockoutSpec(layers=[0, 1, 2], from_positions=[-1], to_positions=None)
    hp_p, hp_z = mi.HookPoint.attn_pattern(0), mi.HookPoint.attn_z(0)
    cache = model.forward(ids, knockout_hooks(model, spec, s).capture(hp_p).capture(hp_z))
    assert not torch.isnan(cache.output).any()
    assert (cache[hp_p][0, :, -1] == 0).all()  # the row attends to nothing
    assert (cache[hp_z][0, -1] == 0).all()
    assert not torch.isnan(cache[hp_p]).any()
    r = run_knockout(model, ids, spec)
    assert torch.isfinite(torch.tensor(r.kl_divergence()))


def test_ablation_result_metrics_match_hand_computation():
    b = torch.tensor([2.0, 1.0, 0.0])
    a = torch.tensor([0.0, 1.0, 2.0])
    r = AblationResult(b, a)
    p, q = torch.softmax(b, 0), torch.softmax(a, 0)
    assert r.kl_divergence() == pytest.approx(float((p * (p / q).log()).sum()), abs=1e-6)
    top = r.top_changed_tokens(2)
    assert {t.token_id for t in top} == {0, 2}
    assert abs(top[0].prob_diff) == pytest.approx(float((p - q).abs().max()), abs=1e-6)
    assert AblationResult(b, b).kl_divergence() == pytest.approx(0.0, abs=1e-7)


def test_effects_are_ablated_minus_baseline_and_logprob_is_shift_invariant():
    """Token 0 goes from p=softmax(b)[0] to softmax(a)[0]: every difference is negative."""
    b = torch.tensor([2.0, 1.0, 0.0])
    a = torch.tensor([0.0, 1.0, 2.0])
    r = AblationResult(b, a)
    p, q = torch.softmax(b, 0), torch.softmax(a, 0)
    assert r.logit_diff(0) == pytest.approx(-2.0)  # 0.0 - 2.0
    assert r.prob_diff(0) == pytest.approx(float(q[0] - p[0]), abs=1e-7) and r.prob_diff(0) < 0
    assert r.logprob_diff(0) == pytest.approx(float(q[0].log() - p[0].log()), abs=1e-6)
    shifted = AblationResult(b, a + 7.0)  # the same distribution, logits offset by 7
    assert shifted.logprob_diff(0) == pytest.approx(r.logprob_diff(0), abs=1e-5)
    assert shifted.kl_divergence() == pytest.approx(r.kl_divergence(), abs=1e-6)
    assert shifted.logit_diff(0) == pytest.approx(5.0)  # the raw logit difference is not
    s = r.summary
    assert s.baseline_top.token_id == 0 and s.intervened_top.token_id == 2
    assert s.top_changed[0].prob_diff == pytest.approx(r.prob_diff(s.top_changed[0].token_id))


def test_ablation_result_round_trips_json(model):
    r = run_knockout(model, "hello", KnockoutSpec(layers=[1]).edge(-1, 0))
    back = from_json(to_json(r), AblationResult)
    torch.testing.assert_close(back.baseline_logits, r.baseline_logits)
    assert back.token_strs == r.token_strs
    assert back.kl_divergence() == pytest.approx(r.kl_divergence())


def test_json_without_raw_keeps_spec_prompt_and_metrics_but_not_logits(model):
    spec = KnockoutSpec(layers=[1]).edge(-1, 0)
    r = run_knockout(model, "hello", spec)
    small, full = to_json(r, raw=False), to_json(r)
    assert len(small) < len(full) / 3 and '"ablated_logits": null' in small
    back = from_json(small, AblationResult)
    assert back.baseline_logits is None and back.spec == spec and back.prompt == "hello"
    assert back.kl_divergence() == pytest.approx(r.kl_divergence(), abs=1e-7)
    top = r.summary.baseline_top.token_id
    assert back.logprob_diff(top) == pytest.approx(r.logprob_diff(top), abs=1e-7)
    assert [t.token_id for t in back.top_changed_tokens(3)] == \
        [t.token_id for t in r.top_changed_tokens(3)]
    with pytest.raises(mi.InterventionError, match="raw logits"):
        back.logit_diff(next(i for i in range(model.vocab_size)
                             if i not in {t.token_id for t in back.summary.top_changed}
                             and i != top and i != back.summary.intervened_top.token_id))


def test_small_vocabulary_clamps_the_top_k(model):
    from tests.support.fake_backend import fake_model

    small = fake_model(vocab=8)
    r = run_knockout(small, torch.tensor([[1, 2, 3]]), KnockoutSpec().edge(-1, 0))
    assert len(r.summary.top_changed) == 8 and len(r.top_changed_tokens(50)) == 8


def test_knockout_needs_attention_points(rwkv_like):
    with pytest.raises(mi.HookError, match="attn.hook_attn_scores"):
        run_knockout(rwkv_like, "hi", KnockoutSpec().edge(-1, 0))


def test_mean_ablation_replaces_with_the_mean_over_batch_and_positions(model):
    ref = torch.tensor([[0, 5, 6, 7], [0, 9, 9, 9]])
    hp = mi.HookPoint.resid_post(0)
    want = model.forward(ref, mi.HookSpec().capture(hp))[hp].mean((0, 1))
    hooks = mean_ablation_hooks(model, hp, ref).capture(hp)
    got = model.forward(model.to_tokens("xyzzy"), hooks)[hp]
    torch.testing.assert_close(got[0], want.expand(got.shape[1], -1))


def test_resample_ablation_uses_one_source_row_and_rejects_other_lengths(model):
    src = torch.tensor([[0, 5, 6, 7], [0, 9, 9, 9]])
    hp = mi.HookPoint.resid_pre(1)
    acts = model.forward(src, mi.HookSpec().capture(hp))[hp]
    hooks = resample_ablation_hooks(model, hp, src, torch.Generator().manual_seed(0)).capture(hp)
    got = model.forward(torch.tensor([[0, 1, 2, 3]]), hooks)[hp][0]
    assert any(torch.allclose(got, acts[i]) for i in range(2))
    with pytest.raises(mi.InterventionError, match="cannot broadcast"):
        model.forward(torch.tensor([[0, 1, 2]]), hooks)
