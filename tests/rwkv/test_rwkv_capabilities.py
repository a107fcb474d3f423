"""The RWKV backends declare their capabilities and their own hook points (the core names
neither): state interventions and a recurrent state for generation, no layer schedule."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core import capabilities as caps
from mi_core.interp import RecurrentPassSpec, generate_recurrent

from tests.support.rwkv_ckpt import random_ids


def test_rwkv_declares_what_it_has_and_not_a_layer_schedule(model) -> None:
    have = set(model.capabilities())
    assert {"state interventions", "KV-cached generation", "hook shapes", "weight access",
            "readout", "layer types"} <= have
    assert "layer schedule" not in have
    assert model.layer_types == [f"rwkv{model.config.version}"] * model.num_layers
    ids = random_ids(1, 6)
    with pytest.raises(mi.CapabilityError, match="layer schedule.*rwkv|rwkv.*layer schedule"):
        model.forward(ids, layer_schedule=[0, 1, 1])
    with pytest.raises(mi.CapabilityError, match="generate_recurrent"):
        generate_recurrent(model, ids, RecurrentPassSpec(0, 1), 2)


def test_rwkv_points_are_declared_by_the_plugin_with_factories(model) -> None:
    hp = mi.HookPoint.rwkv_state(1)  # the factory the plugin declared
    assert str(hp) == "blocks.1.rwkv.hook_state" and not hp.is_custom
    assert not mi.HookPoint.parse("blocks.0.rwkv.hook_effective_attn").is_custom
    assert mi.HookPoint.rwkv_decay(0) in model.hook_points()


def test_every_hook_shape_matches_the_captured_activation(model) -> None:
    ids = random_ids(2, 7)
    _, cache = model.run_with_cache(ids)
    assert isinstance(model.backend, caps.HookShapes)
    for name in cache:
        shape = model.backend.hook_shape(mi.HookPoint.parse(name), 2, 7)
        assert shape is not None and list(cache[name].shape) == list(shape), name


def test_state_knockout_still_changes_the_logits_through_the_capability(model) -> None:
    ids = random_ids(1, 6)
    base = model.forward(ids).output
    ko = model.forward(ids, mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec().position(1)))
    assert float((ko.output - base).abs().max()) > 1e-4
    with pytest.raises(mi.InterventionError, match="position 9"):
        model.forward(ids, mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec().position(9)))
    assert torch.equal(model.forward(ids).output, base)


@pytest.mark.parametrize("version", ["v6", "v7"])
def test_gradients_through_a_hook_point_match_finite_differences(request, version) -> None:
    """Reference: central differences (eps 1e-2) on a float64 model. The WKV state is kept
    in F32, which limits the agreement to ~1e-5 absolute (measured ~3e-6)."""
    model = mi.MIModel.from_pretrained(request.getfixturevalue(f"{version}_dir"),
                                       dtype=torch.float64)
    assert "gradients" in model.capabilities()
    ids = random_ids(1, 6)
    point, (pos, dim), eps = "blocks.0.hook_resid_post", (2, 3), 1e-2

    def logit(delta: torch.Tensor) -> torch.Tensor:
        spec = mi.HookSpec().intervene(point, lambda x: x + delta)
        return model.forward(ids, spec).output[0, -1, 5]

    leaf = torch.zeros(1, 6, model.hidden_size, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(logit(leaf), leaf)
    e = torch.zeros(1, 6, model.hidden_size, dtype=torch.float64)
    e[0, pos, dim] = eps
    fd = (logit(e) - logit(-e)) / (2 * eps)
    assert abs(float(grad[0, pos, dim]) - float(fd)) < 1e-5
    assert float(grad[0, pos, dim]) != 0.0
