"""Hook points: the list, capture shapes, interventions at embedding / residual points."""

from __future__ import annotations

import pytest
import torch

from tests.support.rwkv_ckpt import random_ids

import mi_core as mi


def test_hook_points_cover_the_documented_rwkv_points(model: mi.MIModel) -> None:
    names = {p.name for p in model.hook_points()}
    for i in range(model.num_layers):
        for s in ("hook_resid_pre", "hook_resid_post", "rwkv.hook_state", "rwkv.hook_decay",
                  "rwkv.hook_effective_attn", "hook_attn_out", "hook_mlp_out", "hook_resid_mid"):
            assert f"blocks.{i}.{s}" in names
    assert "hook_embed" in names and "ln_final.hook_normalized" in names


def test_every_capture_has_the_declared_shape(model: mi.MIModel) -> None:
    ids = random_ids(2, 6)
    _, cache = model.run_with_cache(ids, names_filter=lambda n: True)  # the opt-in ones too
    for p in model.hook_points():
        assert tuple(cache[p].shape) == model.backend.hook_shape(p, 2, 6), p.name


def test_final_norm_alias_and_resid_post_project_to_the_logits(model: mi.MIModel) -> None:
    ids = random_ids(1, 5)
    last = f"blocks.{model.num_layers - 1}.hook_resid_post"
    c = model.forward(ids, mi.HookSpec().capture("hook_final_norm").capture(last))
    assert (model.project_to_vocab(c[last]) - c.output).abs().max().item() < 1e-5
    assert c["ln_final.hook_normalized"].shape == (1, 5, model.hidden_size)


@pytest.mark.parametrize("point", ["hook_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_resid_mid",
                                   "blocks.1.hook_resid_post", "blocks.1.hook_attn_out",
                                   "blocks.0.hook_mlp_out"])
def test_interventions_at_embedding_and_residual_points_change_the_output(
        model: mi.MIModel, point: str) -> None:
    ids = random_ids(1, 6)
    base = model.forward(ids).output
    # (Add, not Scale: the layer norms make every point scale-invariant downstream.)
    delta = torch.randn(model.hidden_size, generator=torch.Generator().manual_seed(3))
    out = model.forward(ids, mi.HookSpec().intervene(point, mi.Add(delta))).output
    assert (out - base).abs().max().item() > 1e-3


def test_replacing_the_last_residual_sets_the_logits(model: mi.MIModel) -> None:
    ids = random_ids(1, 4)
    x = torch.randn(1, 4, model.hidden_size)
    last = f"blocks.{model.num_layers - 1}.hook_resid_post"
    out = model.forward(ids, mi.HookSpec().intervene(last, mi.Replace(x))).output
    assert (out - model.project_to_vocab(x)).abs().max().item() < 1e-5


def test_decay_of_one_and_zero_keys_freezes_the_state(model: mi.MIModel) -> None:
    """With decay 1 and every key zeroed the WKV state stays at zero."""
    ids = random_ids(1, 5)
    spec = (mi.HookSpec().intervene("blocks.0.rwkv.hook_decay", lambda t, h: torch.ones_like(t))
            .intervene("blocks.0.attn.hook_k", mi.Zero()).capture("blocks.0.rwkv.hook_state")
            .capture("blocks.0.rwkv.hook_decay"))
    c = model.forward(ids, spec)
    assert c["blocks.0.rwkv.hook_state"].abs().max().item() == 0.0
    assert torch.all(c["blocks.0.rwkv.hook_decay"] == 1.0)


def test_bad_operand_shape_and_unknown_layer_are_errors_before_compute(model: mi.MIModel) -> None:
    ids = random_ids(1, 4)
    with pytest.raises(mi.InterventionError):
        model.forward(ids, mi.HookSpec().intervene("blocks.0.rwkv.hook_state", mi.Add(torch.ones(3, 3))))
    with pytest.raises(mi.HookError, match="out of range"):
        model.forward(ids, mi.HookSpec().capture(f"blocks.{model.num_layers}.hook_resid_post"))
    with pytest.raises(mi.InterventionError):
        model.forward(ids, mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec(positions=[0]).layer(9)))


def test_ln_scale_hooks_give_the_divisor_and_leave_logits_unchanged(model: mi.MIModel) -> None:
    ids = random_ids(1, 5)
    base = model.forward(ids).output
    c = model.forward(ids, mi.HookSpec().capture("ln_final.hook_scale").capture("blocks.1.ln2.hook_scale")
                      .capture("blocks.1.hook_resid_post").capture("blocks.1.hook_resid_mid"))
    assert torch.equal(c.output, base)  # capturing the divisor changes no number
    x = c["blocks.1.hook_resid_post"]
    expected = (x.var(-1, unbiased=False, keepdim=True) + model.config.norm_eps).sqrt()
    assert (c["ln_final.hook_scale"] - expected).abs().max().item() < 1e-5
    mid = c["blocks.1.hook_resid_mid"]
    expected_mid = (mid.var(-1, unbiased=False, keepdim=True) + model.config.norm_eps).sqrt()
    assert (c["blocks.1.ln2.hook_scale"] - expected_mid).abs().max().item() < 1e-5
    # An intervention on the scale takes effect (doubling it halves the centred part).
    halved = model.forward(ids, mi.HookSpec().intervene("ln_final.hook_scale", mi.Scale(2.0))).output
    assert (halved - base).abs().max().item() > 1e-3


def test_final_norm_with_captured_scale_reproduces_the_normalized_output(model: mi.MIModel) -> None:
    ids = random_ids(1, 5)
    last = f"blocks.{model.num_layers - 1}.hook_resid_post"
    c = model.forward(ids, mi.HookSpec().capture("ln_final.hook_scale").capture(last)
                      .capture("ln_final.hook_normalized"))
    be = model.backend
    again = be.final_norm(c[last], scale=c["ln_final.hook_scale"])
    # hook_normalized is before the gain and bias (TransformerLens); the head reads it after
    w, b = be.get_weight("ln_final.w"), be.get_weight("ln_final.b")
    assert (again - (c["ln_final.hook_normalized"] * w + b)).abs().max().item() < 1e-5
    assert (be.unembed(again) - c.output).abs().max().item() < 1e-4
    assert torch.equal(be.get_weight("W_U"), be.head.T)
    with pytest.raises(mi.WeightLoadError, match="W_Q"):
        be.get_weight("W_Q", 0)


def test_ln_hook_normalized_is_before_the_gain_and_hook_in_is_the_sublayer_input(model: mi.MIModel) -> None:
    """As TransformerLens: ``lnK.hook_normalized`` = (x - mean) / sqrt(var + eps), and the
    time / channel mix read ``attn.hook_in`` / ``mlp.hook_in`` = that * weight + bias (the
    checkpoint's LayerNorm tensors), by the explicit formula (F32, 1e-5)."""
    ids = random_ids(2, 6)
    base = model.forward(ids).output
    names = [f"blocks.1.{s}" for s in ("hook_resid_pre", "ln1.hook_normalized", "attn.hook_in",
                                       "hook_resid_mid", "ln2.hook_normalized", "mlp.hook_in")]
    c = model.forward(ids, mi.HookSpec().capture_all(names))
    assert torch.equal(c.output, base)  # capturing changes no number
    eps, layer = model.config.norm_eps, model.backend.layers[1]
    for x_name, ln, (w, b) in (("hook_resid_pre", "ln1", layer.ln1), ("hook_resid_mid", "ln2", layer.ln2)):
        x = c[f"blocks.1.{x_name}"]
        n = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
        assert (c[f"blocks.1.{ln}.hook_normalized"] - n).abs().max().item() < 1e-5
        sub = "attn" if ln == "ln1" else "mlp"
        assert (c[f"blocks.1.{sub}.hook_in"] - (n * w + b)).abs().max().item() < 1e-5
    # An intervention at hook_normalized feeds the rest of the model through the gain.
    same = model.forward(ids, mi.HookSpec().intervene("blocks.1.ln2.hook_normalized", lambda t, hook: t)).output
    assert (same - base).abs().max().item() < 1e-5
    zeroed = model.forward(ids, mi.HookSpec().intervene("blocks.1.ln2.hook_normalized", mi.Zero())
                           .capture("blocks.1.mlp.hook_in"))
    assert torch.allclose(zeroed["blocks.1.mlp.hook_in"], layer.ln2[1].expand(2, 6, -1))  # bias only
