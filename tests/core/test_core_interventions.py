"""Intervention semantics, applied through the one shared function, checked against the toy
model's forward written out by hand (tests/core/conftest.py::toy_reference)."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from tests.support.toy_checkpoint import toy_reference

TOL = 1e-6  # F32, same ops in the same order: only rounding differences


def test_empty_spec_matches_reference_forward(toy_model, toy_weights, ids) -> None:
    ref = toy_reference(toy_weights, ids)
    cache = toy_model.forward(ids, mi.HookSpec())
    assert len(cache) == 0
    assert (cache.output - ref["logits"]).abs().max() < TOL


def test_capture_every_point_matches_reference(toy_model, toy_weights, ids) -> None:
    ref = toy_reference(toy_weights, ids)
    logits, cache = toy_model.run_with_cache(ids)
    for name in ("hook_embed", "blocks.1.hook_resid_pre", "blocks.2.hook_mlp_out",
                 "blocks.2.hook_resid_post"):
        assert (cache[name] - ref[name]).abs().max() < TOL, name
    assert (logits - ref["logits"]).abs().max() < TOL


def test_zero_at_mlp_out_removes_the_layer(toy_model, toy_weights, ids) -> None:
    w = dict(toy_weights)
    w["layers.1.w"] = torch.zeros_like(w["layers.1.w"])  # tanh(0) = 0: layer 1 contributes nothing
    ref = toy_reference(w, ids)
    out = toy_model.forward(ids, mi.HookSpec().intervene("blocks.1.hook_mlp_out", mi.Zero())).output
    assert (out - ref["logits"]).abs().max() < TOL


def test_replace_broadcasts_and_capture_sees_the_value_after_interventions(toy_model, ids) -> None:
    v = torch.arange(8.0)
    spec = mi.HookSpec().intervene("hook_embed", mi.Replace(v)).capture("hook_embed")
    cache = toy_model.forward(ids, spec)
    assert torch.equal(cache["hook_embed"], v.expand(2, 5, 8))


def test_interventions_apply_in_registration_order(toy_model, ids) -> None:
    base = toy_model.forward(ids, mi.HookSpec().capture("hook_embed"))["hook_embed"]
    one = torch.ones(8)
    a = mi.HookSpec().intervene("hook_embed", mi.Add(one)).intervene("hook_embed", mi.Scale(2.0))
    b = mi.HookSpec().intervene("hook_embed", mi.Scale(2.0)).intervene("hook_embed", mi.Add(one))
    ea = toy_model.forward(ids, a.capture("hook_embed"))["hook_embed"]
    eb = toy_model.forward(ids, b.capture("hook_embed"))["hook_embed"]
    assert torch.allclose(ea, (base + 1) * 2) and torch.allclose(eb, base * 2 + 1)


def test_operand_dtype_is_cast_to_the_activation_dtype(toy_model, ids) -> None:
    spec = mi.HookSpec().intervene("hook_embed", mi.Add(torch.ones(8, dtype=torch.float64)))
    cache = toy_model.forward(ids, spec.capture("hook_embed"))
    assert cache["hook_embed"].dtype == torch.float32


def test_shape_that_cannot_broadcast_fails_before_compute_naming_point_and_shapes(toy_model, ids) -> None:
    calls = []
    spec = (mi.HookSpec().intervene("hook_embed", lambda t, hook: calls.append(1))
            .intervene("blocks.0.hook_resid_post", mi.Add(torch.ones(3))))
    with pytest.raises(mi.InterventionError,
                       match=r"Add at blocks\.0\.hook_resid_post.*\[3\].*\[2, 5, 8\]"):
        toy_model.forward(ids, spec)
    assert calls == []  # nothing ran: validation happened before compute


def test_callable_may_modify_in_place_and_return_none(toy_model, ids) -> None:
    def zero_first_position(t: torch.Tensor, hook: mi.HookPoint) -> None:
        assert hook.name == "hook_embed"
        t[:, 0] = 0.0

    cache = toy_model.forward(ids, mi.HookSpec().intervene("hook_embed", zero_first_position)
                              .capture("hook_embed"))
    assert cache["hook_embed"][:, 0].abs().sum() == 0


def test_callable_that_changes_the_shape_is_an_error(toy_model, ids) -> None:
    with pytest.raises(mi.InterventionError, match="changed the shape"):
        toy_model.forward(ids, mi.HookSpec().intervene("hook_embed", lambda t, h: t[:, :1]))


def test_run_with_hooks_matches_forward_with_the_same_callables(toy_model, ids) -> None:
    fn = lambda t, hook: t * 0.5  # noqa: E731
    a = toy_model.run_with_hooks(ids, fwd_hooks=[("blocks.1.hook_resid_post", fn)])
    b = toy_model.forward(ids, mi.HookSpec().intervene("blocks.1.hook_resid_post", fn)).output
    assert torch.equal(a, b)


def test_knockout_mask_is_additive_before_softmax() -> None:
    scores = torch.zeros(1, 1, 2, 3)
    mask = torch.tensor([0.0, float("-inf"), 0.0])
    out = mi.Knockout(mask)(scores, mi.HookPoint.attn_scores(0))
    assert torch.softmax(out, -1)[0, 0, 0].tolist() == pytest.approx([0.5, 0.0, 0.5])


def test_steer_scales_selected_edges_and_renormalises_rows() -> None:
    pattern = torch.tensor([[[[0.5, 0.5], [0.25, 0.75]]]])
    mask = torch.tensor([True, False])  # key 0, every query
    out = mi.Steer(mask, scale=3.0)(pattern, mi.HookPoint.attn_pattern(0))
    # row 0: (1.5, 0.5)/2 ; row 1: (0.75, 0.75)/1.5
    assert torch.allclose(out, torch.tensor([[[[0.75, 0.25], [0.5, 0.5]]]]))
    assert torch.allclose(out.sum(-1), torch.ones(1, 1, 2))


def test_steer_set_value_without_renormalisation() -> None:
    pattern = torch.full((1, 1, 2, 2), 0.5)
    out = mi.Steer(torch.tensor([False, True]), value=0.0, renormalize=False)(
        pattern, mi.HookPoint.attn_pattern(0))
    assert out[..., 1].abs().sum() == 0 and torch.all(out[..., 0] == 0.5)
