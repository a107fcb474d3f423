"""The transformer backend declares its capabilities (no recurrent state), and its hook
shapes (the core's standard table plus its own q/k-norm and post-norm points) are the
shapes of the activations it really produces."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi


def test_the_transformer_declares_its_capabilities_and_no_state(llama_model) -> None:
    assert set(llama_model.capabilities()) == {
        "hook shapes", "KV-cached generation", "layer schedule", "weight access", "readout",
        "gradients", "weight processing", "layer types", "context length"}


@pytest.mark.parametrize("spec", [mi.StateKnockoutSpec().position(1), mi.StateSteeringSpec(0.0, [1])],
                         ids=["knockout", "steering"])
def test_a_state_spec_on_the_transformer_is_refused_before_compute(llama_model, make_ids,
                                                                  spec, monkeypatch) -> None:
    def no_compute(*a, **k):
        raise AssertionError("the forward ran")

    hooks = mi.HookSpec()
    if isinstance(spec, mi.StateKnockoutSpec):
        hooks.set_state_knockout(spec)
    else:
        hooks.set_state_steering(spec)
    monkeypatch.setattr(llama_model.backend, "forward", no_compute)
    with pytest.raises(mi.CapabilityError, match="state interventions.*transformer backend"):
        llama_model.forward(make_ids(1, 6), hooks)


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2"])
def test_every_hook_shape_matches_the_captured_activation(tiny, make_ids, name) -> None:
    model = tiny(name).load()
    ids = make_ids(2, 7)
    # every point, opt-in ones included (a callable filter skips those, as TransformerLens)
    _, cache = model.run_with_cache(ids, names_filter=[p.name for p in model.hook_points()])
    assert len(cache) == len(model.hook_points())
    for point in model.hook_points():
        want = model.backend.hook_shape(point, 2, 7)
        got = list(cache[point].shape)
        assert len(got) == len(want), point.name
        assert all(w in (g, -1) for g, w in zip(got, want)), (point.name, got, want)
    assert model.backend.hook_shape("blocks.0.attn.hook_pattern", 2, 7) == (2, 4, 7, -1)
    assert torch.isfinite(cache.output).all()
