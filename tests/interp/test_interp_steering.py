"""Attention and residual steering, calibration, dose-response, contrastive vectors."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    DoseResponseCurve, KnockoutSpec, SteeringCalibration, SteeringResult, SteeringSpec,
    apply_steering, contrastive_steering_vector, dose_response, run_knockout, steering_hooks,
)
from mi_core.serialize import from_json, to_json


def test_scale_zero_equals_a_knockout_of_the_same_edges(model):
    """Post-softmax scale 0 + renormalisation == pre-softmax -inf (independent mechanism)."""
    ids = model.to_tokens("steer me")
    st = apply_steering(model, ids, SteeringSpec.attention([0, 2], to_positions=[1, 2],
                                                           from_positions=[-1], scale=0.0))
    ko = run_knockout(model, ids, KnockoutSpec(layers=[0, 2], from_positions=[-1], to_positions=[1, 2]))
    torch.testing.assert_close(st.steered_logits, ko.ablated_logits, atol=1e-5, rtol=0)
    assert st.steered_attention == pytest.approx(0.0, abs=1e-7)


def test_scale_one_changes_nothing_and_set_value_renormalises(model):
    ids = model.to_tokens("steer me")
    same = apply_steering(model, ids, SteeringSpec.attention([1], to_positions=[0], scale=1.0))
    assert same.kl_divergence() == pytest.approx(0.0, abs=1e-6)
    spec = SteeringSpec.attention([1], to_positions=[0], from_positions=[-1], heads=[1], value=0.9)
    hp = mi.HookPoint.attn_pattern(1)
    pat = model.forward(ids, steering_hooks(model, spec, ids.shape[1]).capture(hp))[hp][0]
    torch.testing.assert_close(pat.sum(-1), torch.ones(4, ids.shape[1]))
    base = model.forward(ids, mi.HookSpec().capture(hp))[hp][0]
    row = base[1, -1].clone()
    row[0] = 0.9
    torch.testing.assert_close(pat[1, -1], row / row.sum())
    torch.testing.assert_close(pat[0], base[0])  # other heads untouched


def test_residual_steering_adds_strength_times_direction(model):
    ids = model.to_tokens("abc")
    d = torch.randn(model.hidden_size)
    spec = SteeringSpec.residual([1], d, strength=2.5, positions=[-1])
    hp = mi.HookPoint.resid_pre(1)
    got = model.forward(ids, steering_hooks(model, spec, ids.shape[1]).capture(hp))[hp]
    base = model.forward(ids, mi.HookSpec().capture(hp))[hp]
    want = base.clone()
    want[0, -1] += 2.5 * d
    torch.testing.assert_close(got, want)
    with pytest.raises(mi.InterventionError, match="d_model"):
        steering_hooks(model, SteeringSpec.residual([1], torch.ones(5)), 4)


def test_bad_positions_heads_layers(model):
    with pytest.raises(mi.InterventionError, match="out of range"):
        steering_hooks(model, SteeringSpec.attention([0], to_positions=[10]), 4)
    with pytest.raises(mi.InterventionError, match="head 7"):
        steering_hooks(model, SteeringSpec.attention([0], to_positions=[0], heads=[7]), 4)
    with pytest.raises(mi.HookError, match="layer 5"):
        steering_hooks(model, SteeringSpec.attention([5], to_positions=[0]), 4)


def test_calibration_measures_baseline_attention(model):
    ids = model.to_tokens("calibrate")
    spec = SteeringSpec.attention([0, 1], to_positions=[0], from_positions=[-1])
    cal = SteeringCalibration.measure(model, ids, spec)
    hp = mi.HookPoint.attn_pattern(1)
    pat = model.forward(ids, mi.HookSpec().capture(hp))[hp][0]
    assert cal.attention[1] == pytest.approx(float(pat[:, -1, 0].mean()), abs=1e-6)
    assert cal.value_for_multiple(2.0) == pytest.approx(2 * cal.mean_attention)
    assert from_json(to_json(cal), SteeringCalibration) == cal


def test_dose_response_curve(model):
    ids = model.to_tokens("dose")
    spec = SteeringSpec.attention([0, 1, 2], to_positions=[0], from_positions=[-1])
    curve = dose_response(model, ids, spec, [0.0, 1.0, 4.0], target=7)
    assert curve.strengths() == [0.0, 1.0, 4.0]
    assert curve.kls()[1] == pytest.approx(0.0, abs=1e-6)
    att = [p.steered_attention for p in curve.points]
    assert att[0] < att[1] < att[2]  # more scale, more attention to the target key
    assert curve.points[1].target_prob == pytest.approx(curve.baseline_prob, abs=1e-6)
    back = from_json(to_json(curve), DoseResponseCurve)
    assert back == curve


def test_steering_result_round_trips(model):
    r = apply_steering(model, "xy", SteeringSpec.attention([0], to_positions=[0], scale=3.0))
    back = from_json(to_json(r), SteeringResult)
    torch.testing.assert_close(back.steered_logits, r.steered_logits)
    assert back.steered_attention == r.steered_attention


def test_contrastive_vector_is_the_mean_difference(model):
    pos, neg = ["good", "great day"], ["bad", "awful"]
    v = contrastive_steering_vector(model, pos, neg, layer=1)
    hp = mi.HookPoint.resid_pre(1)

    def last(t):
        return model.forward(model.to_tokens(t), mi.HookSpec().capture(hp))[hp][0, -1]
    want = (last("good") + last("great day")) / 2 - (last("bad") + last("awful")) / 2
    torch.testing.assert_close(v, want)
    vm = contrastive_steering_vector(model, pos, neg, layer=1, position="mean", normalize=True)
    assert float(vm.norm()) == pytest.approx(1.0)
    with pytest.raises(mi.InterventionError, match="at least one"):
        contrastive_steering_vector(model, [], neg, layer=1)


def test_attention_steering_needs_attention_points(rwkv_like):
    with pytest.raises(mi.HookError, match="hook_pattern"):
        apply_steering(rwkv_like, "ab", SteeringSpec.attention([0], to_positions=[0]))
    d = torch.ones(rwkv_like.hidden_size)
    r = apply_steering(rwkv_like, "ab", SteeringSpec.residual([0], d, 1.0))
    assert r.kl_divergence() > 0


def test_steering_and_knockout_share_the_sign_convention(model):
    """Scale 0 steering == knockout of the same edges, so every effect must agree, sign too
    (both are intervened - baseline); reference: log_softmax of the two logit vectors."""
    ids = model.to_tokens("steer me")
    st = apply_steering(model, ids, SteeringSpec.attention([0, 2], to_positions=[1, 2],
                                                           from_positions=[-1], scale=0.0))
    ko = run_knockout(model, ids,
                      KnockoutSpec(layers=[0, 2], from_positions=[-1], to_positions=[1, 2]))
    tok = ko.summary.top_changed[0].token_id
    ref = float(torch.log_softmax(st.steered_logits, -1)[tok]
                - torch.log_softmax(st.baseline_logits, -1)[tok])
    assert st.logprob_diff(tok) == pytest.approx(ref, abs=1e-6)
    assert ko.logprob_diff(tok) == pytest.approx(ref, abs=1e-4)
    assert st.logit_diff(tok) == pytest.approx(ko.logit_diff(tok), abs=1e-4)
    assert st.prob_diff(tok) == pytest.approx(ko.prob_diff(tok), abs=1e-5)


def test_dose_response_points_carry_shift_invariant_target_effects(model):
    spec = SteeringSpec.attention([0], to_positions=[0])
    curve = dose_response(model, "abc", spec, [0.0, 1.0, 3.0], target=5)
    assert curve.spec == spec and curve.prompt == "abc" and curve.target_token_str == "\x04"
    one = curve.points[1]  # scale 1 is the identity: no effect
    assert one.target_prob_diff == pytest.approx(0.0, abs=1e-6)
    for p in curve.points:
        assert p.target_prob_diff == pytest.approx(p.target_prob - curve.baseline_prob, abs=1e-6)
        assert p.target_logprob_diff == pytest.approx(
            float(torch.tensor(p.target_prob).log() - torch.tensor(curve.baseline_prob).log()),
            abs=1e-4)
    back = from_json(to_json(curve), DoseResponseCurve)
    assert back.spec == spec and back.points == curve.points
