"""Activation patching: exact grids on cases with known answers; attribution patching against
a finite-difference of exact patching (its definition)."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    MetricError, PatchingResult, attribution_patching, logit_diff_metric, patching_grid,
)
from mi_core.serialize import from_json, to_json

CLEAN, CORRUPT = "hello world", "jello world"  # differ only at token 1 (after BOS)


def _metric(model):
    out = model.forward(model.to_tokens(CLEAN)).output[0, -1]
    return logit_diff_metric(int(out.argmax()), int(out.argmin()))


def test_resid_pre_layer0_patch_restores_clean_exactly_at_the_changed_token(model):
    r = patching_grid(model, CLEAN, CORRUPT, _metric(model), "resid_pre", layers=[0])
    assert r.grid.shape == (1, 12)
    assert float(r.grid[0, 1]) == pytest.approx(1.0, abs=1e-5)
    others = torch.cat([r.grid[0, :1], r.grid[0, 2:]])
    assert others.abs().max() < 1e-5  # patching identical activations changes nothing
    assert r.columns[1] == "1:'h'"


def test_resid_post_last_position_last_layer_restores_clean(model):
    r = patching_grid(model, CLEAN, CORRUPT, _metric(model), "resid_post",
                      layers=[model.num_layers - 1], positions=[-1])
    assert float(r.grid[0, 0]) == pytest.approx(1.0, abs=1e-5)


def test_batched_grid_equals_one_run_per_cell(model):
    metric = _metric(model)
    r = patching_grid(model, CLEAN, CORRUPT, metric, "attn_out", layers=[1], batch_size=3)
    clean, corr = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    hp = mi.HookPoint.attn_out(1)
    src = model.forward(clean, mi.HookSpec().capture(hp))[hp]
    for p in (2, 5, 11):
        def patch(x, hook, p=p):
            x = x.clone()
            x[:, p] = src[:, p]
            return x
        m = float(metric(model.forward(corr, mi.HookSpec().intervene(hp, patch)).output)[0])
        want = (m - r.corrupted_metric) / (r.clean_metric - r.corrupted_metric)
        assert float(r.grid[0, p]) == pytest.approx(want, abs=1e-5)


def test_z_grid_is_layer_by_head(model):
    r = patching_grid(model, CLEAN, CORRUPT, _metric(model), "z")
    assert r.grid.shape == (model.num_layers, model.num_heads)
    assert r.columns == ["H0", "H1", "H2", "H3"]
    assert torch.isfinite(r.grid).all()


@pytest.mark.parametrize("kind", ["resid_pre", "mlp_out", "z"])
def test_attribution_is_the_derivative_of_exact_patching(model, kind):
    """Reference: patch a small step eps along (clean - corrupted) exactly, divide by eps."""
    metric = _metric(model)
    a = attribution_patching(model, CLEAN, CORRUPT, metric, kind, layers=[1])
    clean, corr = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    hp = mi.HookPoint.layer_point(1, {"resid_pre": "hook_resid_pre", "mlp_out": "hook_mlp_out",
                                      "z": "attn.hook_z"}[kind])
    c_act = model.forward(clean, mi.HookSpec().capture(hp))[hp].double()
    k_act = model.forward(corr, mi.HookSpec().capture(hp))[hp].double()
    eps = 1e-3
    cells = [(0, 1), (0, 3)] if kind != "z" else [(0, 0), (0, 2)]
    for row, col in cells:
        step = torch.zeros_like(c_act)
        if kind == "z":
            step[:, :, col] = (c_act - k_act)[:, :, col] * eps
        else:
            step[:, col] = (c_act - k_act)[:, col] * eps
        m = float(metric(model.forward(corr, mi.HookSpec().intervene(hp, mi.Add(step.float()))).output)[0])
        fd = (m - a.corrupted_metric) / eps / (a.clean_metric - a.corrupted_metric)
        assert float(a.grid[row, col]) == pytest.approx(fd, abs=2e-2 * max(1.0, abs(fd)))


def test_attribution_correlates_with_exact_on_the_layer0_resid_grid(model):
    metric = _metric(model)
    e = patching_grid(model, CLEAN, CORRUPT, metric, "resid_pre", layers=[0])
    a = attribution_patching(model, CLEAN, CORRUPT, metric, "resid_pre", layers=[0])
    # only the changed token differs; attribution must be 0 elsewhere too
    assert a.grid[0, 0].abs() < 1e-6 and a.grid[0, 2:].abs().max() < 1e-6
    assert e.grid.shape == a.grid.shape


def test_prompts_of_different_length_are_rejected(model):
    with pytest.raises(mi.InterventionError, match="same token length"):
        patching_grid(model, "abc", "abcd", _metric(model))
    with pytest.raises(mi.InterventionError, match="same token length"):
        attribution_patching(model, "abc", "abcd", _metric(model))


def test_constant_metric_is_a_metric_error(model):
    with pytest.raises(MetricError, match="cannot be normalised"):
        patching_grid(model, CLEAN, CORRUPT, lambda logits: logits[:, -1, 0] * 0)
    assert issubclass(MetricError, mi.MIError)


def test_unknown_kind_and_bad_metric_shape(model):
    with pytest.raises(mi.InterventionError, match="unknown patch kind"):
        patching_grid(model, CLEAN, CORRUPT, _metric(model), "rot_q")
    with pytest.raises(MetricError, match="one value per batch row"):
        patching_grid(model, CLEAN, CORRUPT, lambda lg: lg[:, -1, :3])


def test_patching_result_round_trips_json(model):
    r = patching_grid(model, CLEAN, CORRUPT, _metric(model), "resid_pre", layers=[0, 2])
    back = from_json(to_json(r), PatchingResult)
    torch.testing.assert_close(back.grid, r.grid)
    assert back.columns == r.columns and back.layers == [0, 2]
    assert r.top(1)[0][:2] == (0, "1:'h'")


def test_patching_effect_is_patched_minus_corrupted_in_metric_units(model):
    metric = logit_diff_metric(3, 4)
    r = patching_grid(model, "hello", "jello", metric, "resid_pre", layers=[0], positions=[1])
    ids = model.to_tokens("jello")
    hp = mi.HookPoint.resid_pre(0)
    clean = model.forward(model.to_tokens("hello"), mi.HookSpec().capture(hp))[hp]

    def patch(x, hook):
        x = x.clone()
        x[0, 1] = clean[0, 1]
        return x
    patched = float(metric(model.forward(ids, mi.HookSpec().intervene(hp, patch)).output)[0])
    assert float(r.effect()[0, 0]) == pytest.approx(patched - r.corrupted_metric, abs=1e-4)
    assert (r.clean_prompt, r.corrupted_prompt) == ("hello", "jello")
