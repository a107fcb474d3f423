"""The state-space hook points: names and shapes, effective attention (A @ x == hook_y),
per-step states against transformers' own cached state, interventions against transformers
with a forward hook on the same module, and nothing computed unless asked for."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi

from tests.support.hf_reference import assert_matches_hf_with_hook
from tests.support.ssm_tiny import HIDDEN, ssm_ids

SSM_SUFFIXES = ["ssm.hook_in", "ssm.hook_in_proj", "ssm.hook_conv", "ssm.hook_dt", "ssm.hook_B",
                "ssm.hook_C", "ssm.hook_effective_attn", "ssm.hook_state", "ssm.hook_y",
                "ssm.hook_gate"]


def _x_per_head(cache: mi.HookCache, layer: int, heads: int, head_dim: int) -> torch.Tensor:
    """The conv output's x channels (the first heads * head_dim), per head [b, s, h, p]."""
    conv = cache[f"blocks.{layer}.ssm.hook_conv"]
    return conv[..., :heads * head_dim].unflatten(-1, (heads, head_dim)).float()


def test_every_layer_has_the_documented_points_in_order_with_their_shapes(family,
                                                                           ssm_model) -> None:
    model = ssm_model(family)
    names = [p.name for p in model.hook_points()]
    layer = ["hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized", *SSM_SUFFIXES,
             "hook_mixer_out", "hook_resid_post"]
    assert names == ["hook_embed"] + [f"blocks.{i}.{s}" for i in range(model.num_layers)
                                      for s in layer] + ["ln_final.hook_scale",
                                                         "ln_final.hook_normalized"]
    ids = ssm_ids(2, 13, seed=1)
    cache = model.forward(ids, mi.HookSpec().capture_all(names))
    for n in names:
        assert tuple(cache[n].shape) == model.backend.hook_shape(n, 2, 13), n
    h, p = model.num_heads, model.config.head_dim
    e = h * p  # d_inner
    shapes = {"ssm.hook_dt": (2, 13, h), "ssm.hook_y": (2, 13, h, p),
              "ssm.hook_state": (2, 13, h, p, 8), "ssm.hook_effective_attn": (2, h, 13, 13),
              "ssm.hook_gate": (2, 13, e), "hook_mixer_out": (2, 13, HIDDEN)}
    for suffix, shape in shapes.items():
        assert tuple(cache[f"blocks.1.{suffix}"].shape) == shape, suffix
    assert model.has_hook_point(mi.HookPoint.ssm_state(0))  # declared by mi-ssm


def test_effective_attention_times_x_is_hook_y_per_head(family, ssm_model) -> None:
    """A @ x == y exactly (F32 rounding): the implicit attention, D skip on the diagonal."""
    model = ssm_model(family)
    ids = ssm_ids(2, 19, seed=2)
    h, p = model.num_heads, model.config.head_dim
    for layer in range(model.num_layers):
        n = f"blocks.{layer}.ssm."
        cache = model.forward(ids, mi.HookSpec().capture_all(
            [n + "hook_effective_attn", n + "hook_y", n + "hook_conv"]))
        a, y = cache[n + "hook_effective_attn"], cache[n + "hook_y"]
        ax = torch.einsum("bhts,bshp->bthp", a, _x_per_head(cache, layer, h, p))
        assert (ax - y).abs().max().item() < 1e-5 * max(1.0, y.abs().max().item())
        assert a.triu(1).abs().max().item() == 0.0  # causal


def test_per_step_states_equal_transformers_cached_state_after_each_prefix(family, tiny_ssm,
                                                                           ssm_model) -> None:
    """hook_state[:, t] is the state after token t: transformers' cache after ids[:, :t+1]."""
    t, model = tiny_ssm(family), ssm_model(family)
    ids = ssm_ids(2, 12, seed=3)
    states = model.forward(ids, mi.HookSpec().capture("blocks.1.ssm.hook_state"))[
        "blocks.1.ssm.hook_state"]
    for step in (4, 11):
        with torch.no_grad():
            cache = t.hf(ids[:, :step + 1], use_cache=True).cache_params
        ref = cache.get_recurrent_state(1, state_idx=0)  # [b, heads or d_inner, p?, d_state]
        assert (states[:, step].reshape(ref.shape) - ref).abs().max().item() < 1e-5


def test_zeroing_the_states_leaves_only_the_d_skip(family, ssm_model) -> None:
    model = ssm_model(family)
    ids = ssm_ids(1, 9, seed=4)
    h, p = model.num_heads, model.config.head_dim
    cache = model.forward(ids, mi.HookSpec().intervene("blocks.0.ssm.hook_state", mi.Zero())
                          .capture("blocks.0.ssm.hook_y").capture("blocks.0.ssm.hook_conv"))
    d = model.backend.w.layers[0].mixer.D.float()
    expect = _x_per_head(cache, 0, h, p) * d[:, None]
    assert (cache["blocks.0.ssm.hook_y"] - expect).abs().max().item() < 1e-6


@pytest.mark.parametrize("point, module", [("ssm.hook_in_proj", "mixer.in_proj"),
                                           ("ssm.hook_in", "norm"),
                                           ("hook_mixer_out", "mixer.out_proj")])
def test_an_intervention_equals_transformers_with_a_hook_on_the_same_module(
        family, tiny_ssm, ssm_model, point: str, module: str) -> None:
    t, model = tiny_ssm(family), ssm_model(family)
    ids = ssm_ids(1, 10, seed=5)

    def scale(x: torch.Tensor, hook=None) -> torch.Tensor:
        return x * 1.7

    ours = model.forward(ids, mi.HookSpec().intervene(f"blocks.0.{point}", scale)).output
    target = t.hf.backbone.layers[0].get_submodule(module)
    assert_matches_hf_with_hook(ours, t.hf, ids, target, lambda m, i, o: scale(o))


def test_nothing_is_computed_unless_its_point_is_hooked(ssm_model, monkeypatch) -> None:
    import mi_ssm.common as common

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("computed without a request")

    monkeypatch.setattr(common, "diagonal_effective_attention", boom)
    monkeypatch.setattr(common, "diagonal_states", boom)
    model = ssm_model("mamba2")
    model.forward(ssm_ids(1, 6), mi.HookSpec().capture("blocks.0.ssm.hook_y"))
    with pytest.raises(AssertionError, match="without a request"):  # and they are when asked
        model.forward(ssm_ids(1, 6), mi.HookSpec().capture("blocks.0.ssm.hook_state"))


def test_capturing_every_point_changes_the_logits_by_rounding_only(family, ssm_model) -> None:
    """The per-step states (captured) come from the exact recurrence, the forward from the
    chunked scan: the same numbers to F32 rounding."""
    model = ssm_model(family)
    ids = ssm_ids(1, 17, seed=6)
    plain = model.forward(ids).output
    full = model.forward(ids, mi.HookSpec().capture_all(model.hook_points())).output
    assert (full - plain).abs().max().item() < 1e-4
