"""Hook points and state interventions of the hybrid families: each layer has its own mixer's
points (attention layers every attention point, mixer layers the ssm points and
hook_mixer_out), then its MLP's or mixture of experts'; shapes as declared; effective
attention (A @ x == hook_y) on every mixer layer; an intervention equals transformers with a
forward hook on the same module; state specs reach the mixer layers and refuse the others."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi

from tests.support.hf_reference import assert_matches_hf_with_hook
from tests.support.hybrid_tiny import HYBRID_FAMILIES, HYBRID_LAYER_TYPES, hybrid_model, \
    tiny_hybrid
from tests.support.ssm_tiny import ssm_ids


@pytest.fixture(params=sorted(HYBRID_FAMILIES))
def hybrid(request: pytest.FixtureRequest) -> str:
    return request.param


def test_each_layer_has_its_mixers_points_then_its_mlps_with_their_shapes(hybrid) -> None:
    model = hybrid_model(hybrid)
    names = [p.name for p in model.hook_points()]
    for i, kind in enumerate(HYBRID_LAYER_TYPES[hybrid]):
        p = f"blocks.{i}."
        mine = [n for n in names if n.startswith(p)]
        attn = p + "attn.hook_pattern" in mine
        assert attn == (kind == "full_attention"), (i, kind)
        assert (p + "ssm.hook_y" in mine) == (kind not in ("full_attention", "mlp"))
        # Nemotron-H: one sublayer per layer (a mixer, attention or an MLP alone)
        has_mlp = kind == "mlp" or hybrid != "nemotron_h"
        assert (p + "hook_mlp_out" in mine) == has_mlp
        order = [p + "hook_attn_out", p + "hook_mixer_out", p + "hook_resid_mid",
                 p + "hook_mlp_out", p + "hook_resid_post"]
        at = [mine.index(n) for n in order if n in mine]
        assert at == sorted(at) and len(at) == 1 + attn + (kind not in ("full_attention", "mlp")) \
            + 2 * has_mlp - (kind == "mlp"), (i, kind, at)
    ids = ssm_ids(2, 11, seed=1)
    cache = model.forward(ids, mi.HookSpec().capture_all(names))
    for n in names:  # (-1: a key axis, any length)
        want = model.backend.hook_shape(n, 2, 11)
        assert want is not None and len(want) == cache[n].dim(), n
        assert all(w in (-1, g) for w, g in zip(want, cache[n].shape)), (n, want)


def test_effective_attention_times_x_is_hook_y_on_every_mixer_layer(hybrid) -> None:
    model = hybrid_model(hybrid)
    ids = ssm_ids(2, 13, seed=2)
    for i, kind in enumerate(HYBRID_LAYER_TYPES[hybrid]):
        if kind in ("full_attention", "mlp"):
            continue
        n = f"blocks.{i}.ssm."
        cache = model.forward(ids, mi.HookSpec().capture_all(
            [n + "hook_effective_attn", n + "hook_y", n + "hook_conv"]))
        a, y = cache[n + "hook_effective_attn"], cache[n + "hook_y"]
        h, p = y.shape[2], y.shape[3]  # Mamba-1: heads = d_inner channels, head_dim 1
        x = cache[n + "hook_conv"][..., :h * p].unflatten(-1, (h, p)).float()
        ax = torch.einsum("bhts,bshp->bthp", a, x)
        assert (ax - y).abs().max().item() < 1e-5 * max(1.0, y.abs().max().item())


#: family -> (our layer, its mixer's module in transformers)
_MODULES = {"jamba": (0, "model.layers.0.mamba"), "bamba": (0, "model.layers.0.mamba"),
            "granitemoehybrid": (0, "model.layers.0.mamba"),
            "nemotron_h": (3, "model.layers.3.mixer")}


@pytest.mark.parametrize("name", sorted(_MODULES))
@pytest.mark.parametrize("point, module", [("ssm.hook_in_proj", "in_proj"),
                                           ("hook_mixer_out", "out_proj")])
def test_an_intervention_equals_transformers_with_a_hook_on_the_same_module(
        name: str, point: str, module: str) -> None:
    t, model = tiny_hybrid(name), hybrid_model(name)
    layer, mixer = _MODULES[name]
    ids = ssm_ids(1, 10, seed=5)

    def scale(x: torch.Tensor, hook=None) -> torch.Tensor:
        return x * 1.7

    ours = model.forward(ids, mi.HookSpec().intervene(f"blocks.{layer}.{point}", scale)).output
    target = t.hf.get_submodule(f"{mixer}.{module}")
    # (Granite scales the mixer's output by residual_multiplier after out_proj: scaling
    # either is the same linear change)
    assert_matches_hf_with_hook(ours, t.hf, ids, target, lambda m, i, o: scale(o))


def test_state_specs_reach_the_mixer_layers_and_refuse_an_attention_layer(hybrid) -> None:
    model = hybrid_model(hybrid)
    types = HYBRID_LAYER_TYPES[hybrid]
    ids = ssm_ids(1, 9, seed=3)
    plain = model.forward(ids).output
    ko = model.forward(ids, mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec([2]))).output
    assert (ko - plain)[:, :2].abs().max().item() < 1e-5  # causal: before the write, no change
    assert (ko - plain)[:, 2:].abs().max().item() > 1e-3
    attn = types.index("full_attention")
    with pytest.raises(mi.InterventionError, match=f"layer {attn} is a 'full_attention' layer"):
        model.forward(ids, mi.HookSpec().set_state_knockout(
            mi.StateKnockoutSpec([2]).layer(attn)))
