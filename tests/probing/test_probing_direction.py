"""Probe directions as interventions: Add along the direction moves the probe's readout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mi_core as mi
from mi_core.serialize import from_json, to_json
from mi_probing import (
    DoseResponse,
    Position,
    ProbingError,
    collect_activations,
    fit_probe,
    last_token_logit_diff,
    mean_dose_response,
    model_space_weights,
    probe_direction,
    probe_steering_spec,
    steer_with_probe,
    steering_hooks,
)

TEXTS = ["the film was good", "the movie is bad", "a plot was great", "the acting is awful",
         "one dog was good", "the cat is bad", "red house was great", "a tree is awful"] * 2
LABELS = [1, 0] * 8
HOOK = "blocks.1.hook_resid_post"


@pytest.fixture()
def probe(toy_model: mi.MIModel):
    acts = collect_activations(toy_model, TEXTS, [HOOK], progress=False)
    return fit_probe(acts[HOOK], LABELS, hook=HOOK, cv=2, n_shuffles=0)


def test_adding_alpha_times_the_direction_moves_the_readout_by_alpha_times_the_weight_norm(
        toy_model, probe):
    # Linear identity: readout(x + a u) - readout(x) = a |coef / scale| at the probed point
    # (the capture records the value after the intervention). float32 activations vs
    # float64 weights: 1e-4 relative.
    ids, mask = toy_model.to_tokens_padded(TEXTS[:4], side="right")
    base = toy_model.forward(ids, mi.HookSpec().capture(HOOK), attention_mask=mask)
    alpha = 2.5
    steered = toy_model.forward(ids, steer_with_probe(probe, alpha).capture(HOOK),
                                attention_mask=mask)
    last = Position.parse("last")
    delta = probe.decision_function(last.reduce(steered[HOOK], mask)) - \
        probe.decision_function(last.reduce(base[HOOK], mask))
    expected = alpha * np.linalg.norm(model_space_weights(probe)[0])
    np.testing.assert_allclose(delta[:, 0], expected, rtol=1e-4)


def test_wrong_sized_direction_is_an_intervention_error_before_compute(toy_model):
    spec = steering_hooks(torch.ones(7), HOOK, 1.0)
    ids = toy_model.to_tokens("the film was good")
    with pytest.raises(mi.InterventionError, match="cannot broadcast"):
        toy_model.forward(ids, spec)


def test_dose_response_is_linear_in_scale_for_a_readout_at_the_steered_point(toy_model, probe):
    # The logits of the toy are a linear read-out of the final residual; a steer at the
    # last layer's output adds scale * (u @ E^T) to them, so the logit difference is exactly
    # linear in the scale (float32: 1e-4 absolute).
    u = probe_direction(probe)
    good, bad = (toy_model.tokenizer.encode(w)[0] for w in ("good", "bad"))
    curve = mean_dose_response(toy_model, TEXTS[:6], u, "blocks.2.hook_resid_post",
                          [-2.0, 0.0, 2.0, 4.0], last_token_logit_diff(good, bad), progress=False)
    emb = toy_model.backend.embed
    slope = float((emb[good] - emb[bad]) @ u)
    np.testing.assert_allclose(np.diff(curve.mean), slope * np.diff(curve.scales), atol=1e-4)
    assert curve.n_prompts == 6 and curve.hook == "blocks.2.hook_resid_post"
    assert from_json(to_json(curve), DoseResponse) == curve


def test_binary_direction_rejects_an_unknown_target(probe):
    with pytest.raises(ProbingError, match="target 7 is not a class"):
        probe_direction(probe, target=7)


def test_probe_steering_spec_drives_the_interp_toolkits_dose_response(toy_model, probe):
    # SteeringSpec.residual at the probe's own layer point; the toy's logits read the final
    # residual linearly, so steering blocks.1.hook_resid_post is not linear downstream
    # (one more tanh layer), but the strength-0 point is the baseline and the spec must
    # reach the model: the logit change is 0 at 0 and non-zero elsewhere.
    from mi_core.interp import dose_response

    spec = probe_steering_spec(probe, strength=1.0)
    assert spec.point == "hook_resid_post" and spec.layers == (1,)
    torch.testing.assert_close(spec.direction, probe_direction(probe))
    curve = dose_response(toy_model, "the film was good", spec, [0.0, 3.0], target="good")
    assert curve.points[0].target_logit_diff == pytest.approx(0.0, abs=1e-6)
    assert abs(curve.points[1].target_logit_diff) > 1e-3 and curve.points[1].kl_divergence > 0


def test_probe_steering_spec_needs_a_per_layer_d_model_probe():
    x = np.random.default_rng(0).normal(size=(20, 6))
    flat = fit_probe(x, [0, 1] * 10, hook="hook_embed", cv=2, n_shuffles=0)
    with pytest.raises(ProbingError, match="per-layer point"):
        probe_steering_spec(flat)
