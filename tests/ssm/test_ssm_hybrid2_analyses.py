"""The analyses and views on Falcon-H1 (every layer attention beside Mamba-2), LFM2 (short
convolutions and attention layers) and LFM2-MoE (the same with experts): attention knockout where a layer has attention, state
knockout where it has a recurrent mixer (both on every Falcon-H1 layer), steering of both
kinds, logit lens, patching, decomposition (a Falcon-H1 layer contributes its attention AND
its mixer), SAE splicing at a mixer's input, the attention view, weight processing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    KnockoutSpec, LogitLensAnalysis, SteeringSpec, apply_steering, decompose_resid,
    knockout_hooks, layer_attention, logit_diff_metric, patching_grid, run_for_decomposition,
    run_state_knockout,
)

from tests.support.hybrid2_tiny import HYBRID2_LAYER_TYPES, hybrid2_model
from tests.support.ssm_tiny import ssm_ids

REPS = ["falcon_h1", "lfm2", "lfm2_moe"]
#: (an attention layer, a recurrent layer, its mixer's input point)
_LAYERS = {"falcon_h1": (1, 1, "ssm.hook_in"), "lfm2": (2, 0, "conv.hook_in"),
           "lfm2_moe": (1, 2, "conv.hook_in")}


@pytest.fixture(params=REPS)
def rep(request: pytest.FixtureRequest) -> str:
    return request.param


def test_attention_knockout_and_state_knockout(rep) -> None:
    model = hybrid2_model(rep)
    attn, mix, _ = _LAYERS[rep]
    ids = ssm_ids(1, 8, seed=1)
    plain = model.forward(ids).output
    hooks = knockout_hooks(model, KnockoutSpec(layers=[attn], from_positions=[-1],
                                               to_positions=[0, 1, 2]), 8)
    out = model.forward(ids, hooks).output
    assert (out - plain)[:, :-1].abs().max().item() < 1e-5  # only the last query row changes
    assert (out - plain)[:, -1].abs().max().item() > 1e-4
    if rep != "falcon_h1":  # a convolution layer has no softmax pattern
        with pytest.raises(mi.HookError, match=f"layer {mix} is a 'short_conv' layer"):
            knockout_hooks(model, KnockoutSpec(layers=[mix], from_positions=[-1],
                                               to_positions=[0]), 8)
    ko = run_state_knockout(model, ids, mi.StateKnockoutSpec(positions=[3]).layer(mix))
    assert ko.kl_divergence() > 0 and ko.kl_per_position()[:3].abs().max() == 0


def test_attention_and_residual_steering(rep) -> None:
    model = hybrid2_model(rep)
    attn, mix, _ = _LAYERS[rep]
    ids = ssm_ids(1, 8, seed=2)
    r = apply_steering(model, ids, SteeringSpec.attention([attn], to_positions=[0], scale=4.0))
    assert r.steered_attention > r.baseline_attention
    d = torch.randn(model.hidden_size, generator=torch.Generator().manual_seed(0))
    r = apply_steering(model, ids, SteeringSpec.residual([mix], d, strength=3.0))
    assert (r.steered_logits - r.baseline_logits).abs().max().item() > 1e-3


def test_logit_lens_patching_and_decomposition(rep) -> None:
    model = hybrid2_model(rep)
    ids = ssm_ids(1, 7, seed=3)
    lens = LogitLensAnalysis().run(model, ids, position=-1)
    assert lens.points[-1].top[0].token_id == int(model.forward(ids).output[0, -1].argmax())
    clean, corrupt = ssm_ids(1, 8, seed=4), ssm_ids(1, 8, seed=5)
    top = int(model.forward(clean).output[0, -1].argmax())
    metric = logit_diff_metric(top, (top + 1) % model.vocab_size)
    last = patching_grid(model, clean, corrupt, metric, "resid_post",
                         layers=[model.num_layers - 1], positions=[-1], show_progress=False)
    assert abs(float(last.grid[0, 0]) - 1.0) < 1e-4
    cache = run_for_decomposition(model, ssm_ids(1, 9, seed=6))
    stack, labels = decompose_resid(cache, model.num_layers)
    kinds = [{"full_attention": ["attn"], "short_conv": ["mixer"]}.get(t, ["attn", "mixer"])
             for t in HYBRID2_LAYER_TYPES[rep]]
    assert labels == ["embed"] + [f"{i}_{k}" for i, ks in enumerate(kinds)
                                  for k in ks + ["mlp"]]
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    assert (stack.sum(0) - final).abs().max().item() < 1e-4


def test_an_sae_splices_into_a_mixer_input(rep, tmp_path: Path) -> None:
    from tests.support.sae_tiny_backend import write_saelens_sae

    model = hybrid2_model(rep)
    _, mix, point = _LAYERS[rep]
    sae = mi.load_dictionary(write_saelens_sae(tmp_path / "sae", f"blocks.{mix}.{point}",
                                               model.hidden_size, 48))
    ids = ssm_ids(1, 6)
    plain = model.forward(ids).output
    spliced = model.forward(ids, sae.splice(mi.HookSpec(), model=model)).output
    assert (spliced - plain).abs().max().item() > 1e-3
    exact = model.forward(ids, sae.splice(mi.HookSpec(), include_error=True, model=model)).output
    assert (exact - plain).abs().max().item() < 1e-4


def test_the_attention_view_reads_each_layers_own_attention(rep, tmp_path: Path) -> None:
    """A Falcon-H1 layer has both: the view reads its softmax pattern; its mixer's effective
    attention is there by name. An LFM2 convolution layer: its effective attention."""
    from mi_core.viz import effective_attention_html

    model = hybrid2_model(rep)
    attn, mix, point = _LAYERS[rep]
    pat, p = layer_attention(model, ssm_ids(1, 7), attn)
    assert p.name == f"blocks.{attn}.attn.hook_pattern"
    assert (pat.sum(-1) - 1).abs().max().item() < 1e-5
    eff = f"blocks.{mix}.{point.split('.')[0]}.hook_effective_attn"
    if rep != "falcon_h1":
        a, p = layer_attention(model, ssm_ids(1, 7), mix)
        assert p.name == eff
    else:
        a = model.forward(ssm_ids(1, 7), mi.HookSpec().capture(eff))[eff]
    assert a.shape[-2:] == (7, 7)
    page = effective_attention_html([f"t{i}" for i in range(7)], a[0], tmp_path / "a.html", mix)
    assert "effective attention" in page.read_text()


def test_weight_processing_folds_only_what_keeps_the_numbers(rep) -> None:
    """fold_ln is refused (layers with a mixer), center_unembed keeps the probabilities;
    get_weight gives an attention layer's weights and refuses a convolution layer's."""
    model = hybrid2_model(rep)
    attn, mix, _ = _LAYERS[rep]
    with pytest.raises(mi.MIError, match="sequence mixer"):
        model.backend.process_weights(fold_ln=True)
    assert model.backend.get_weight("W_K", attn).shape == (
        model.backend.num_kv_heads, model.hidden_size, model.backend.d_head)
    if rep != "falcon_h1":
        with pytest.raises(mi.WeightLoadError, match="'short_conv' layer without attention"):
            model.backend.get_weight("W_Q", mix)


def test_the_transformerlens_layer_decomposes_each_layers_branches(rep) -> None:
    """mi_core.tl on these models: ActivationCache.decompose_resid labels a Falcon-H1 layer's
    attention and mixer outputs, an LFM2 convolution layer's mixer output, and sums to the
    residual stream (with mlp_input: to the layer's resid_mid); the config summary reads an
    MLP weight of a convolution layer (get_weight("W_out", 0))."""
    from mi_core.tl import HookedTransformer

    model = hybrid2_model(rep)
    tl = HookedTransformer(model)
    assert tl.cfg.d_mlp == (None if rep == "lfm2_moe" else model.backend.d_mlp)  # MoE: none
    _, cache = tl.run_with_cache(ssm_ids(1, 7))
    stack, labels = cache.decompose_resid(return_labels=True)
    last = model.num_layers - 1
    assert (stack.sum(0) - cache[f"blocks.{last}.hook_resid_post"]).abs().max().item() < 1e-4
    mid, mid_labels = cache.decompose_resid(layer=1, mlp_input=True, return_labels=True)
    assert (mid.sum(0) - cache["blocks.1.hook_resid_mid"]).abs().max().item() < 1e-4
    kind = HYBRID2_LAYER_TYPES[rep][1]
    own = {"full_attention+mamba2": ["1_attn_out", "1_mixer_out"],
           "short_conv": ["1_mixer_out"], "full_attention": ["1_attn_out"]}[kind]
    assert mid_labels[-1 - len(own):] == ["0_mlp_out"] + own


def test_direct_logit_attribution_is_in_the_logits_units() -> None:
    """Falcon-H1 multiplies the logits by lm_head_multiplier (0.75 here): W_U includes it, so
    the components' attributions sum to the logit (RMS final norm without a bias, no b_U:
    the remainder is 0), not to the logit / 0.75."""
    from mi_core.interp import direct_logit_attribution

    model = hybrid2_model("falcon_h1")
    dla = direct_logit_attribution(model, ssm_ids(1, 8, seed=9))
    assert abs(dla.remainder) < 1e-4 and abs(sum(dla.values) - dla.total) < 1e-4
    assert dla.labels[1:4] == ["0_attn", "0_mixer", "0_mlp"]
