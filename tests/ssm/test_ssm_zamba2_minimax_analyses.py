"""The analyses and views on Zamba2 (shared attention before some Mamba-2 layers) and MiniMax
(lightning attention beside softmax attention, residual = alpha * norm output): attention
knockout on the layers with attention beside state knockout on the recurrent ones, steering
of both kinds, logit lens, patching, SAE splicing, the attention view (a softmax pattern or
an effective attention per layer), the residual decomposition (Zamba2: the sum of the mixers'
outputs; MiniMax: refused, its residual stream is not a sum), and no hook aliasing."""

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

from tests.support.inplace import inplace_mismatches, one_torch_thread  # noqa: F401 (fixture)
from tests.support.zamba2_minimax_tiny import zm_ids, zm_model

#: family -> (a layer with softmax attention, a recurrent layer without it, its mixer's
#: effective-attention point)
LAYERS = {"zamba2": (1, 0, "ssm.hook_effective_attn"),
          "minimax": (2, 0, "attn.hook_effective_attn")}


@pytest.fixture(params=sorted(LAYERS))
def rep(request: pytest.FixtureRequest) -> str:
    return request.param


def test_attention_knockout_on_attention_layers_and_state_knockout_on_the_others(rep) -> None:
    model = zm_model(rep)
    attn, rec, _ = LAYERS[rep]
    ids = zm_ids(1, 8, seed=1)
    plain = model.forward(ids).output
    hooks = knockout_hooks(model, KnockoutSpec(layers=[attn], from_positions=[-1],
                                               to_positions=[0, 1, 2]), 8)
    out = model.forward(ids, hooks).output
    # only the last query row changes (the others by the explicit path's rounding only:
    # knockout takes it, the plain run the fused one)
    assert (out - plain)[:, :-1].abs().max().item() < 1e-4
    assert (out - plain)[:, -1].abs().max().item() > 1e-2
    with pytest.raises(mi.HookError, match=f"layer {rec} is a '{model.layer_types[rec]}' layer"):
        knockout_hooks(model, KnockoutSpec(layers=[rec], from_positions=[-1],
                                           to_positions=[0]), 8)
    ko = run_state_knockout(model, ids, mi.StateKnockoutSpec(positions=[3]))
    assert ko.kl_divergence() > 1e-4 and ko.kl_per_position()[:3].abs().max() < 1e-10
    if rep == "minimax":  # a state spec on the softmax-attention layer is refused by name
        with pytest.raises(mi.InterventionError, match="layer 2 is a 'full_attention' layer"):
            model.forward(ids, mi.HookSpec().set_state_knockout(
                mi.StateKnockoutSpec([2]).layer(2)))


def test_attention_and_residual_steering(rep) -> None:
    model = zm_model(rep)
    attn, rec, _ = LAYERS[rep]
    ids = zm_ids(1, 8, seed=2)
    r = apply_steering(model, ids, SteeringSpec.attention([attn], to_positions=[0], scale=4.0))
    assert r.steered_attention > r.baseline_attention
    d = torch.randn(model.hidden_size, generator=torch.Generator().manual_seed(0))
    r = apply_steering(model, ids, SteeringSpec.residual([rec], d, strength=3.0))
    assert (r.steered_logits - r.baseline_logits).abs().max().item() > 1e-3
    steered = model.forward(ids, mi.HookSpec().set_state_steering(
        mi.StateSteeringSpec(3.0, positions=[1]).layer(rec))).output
    assert (steered - model.forward(ids).output)[:, 1:].abs().max().item() > 1e-3


def test_logit_lens_and_patching(rep) -> None:
    model = zm_model(rep)
    ids = zm_ids(1, 7, seed=3)
    lens = LogitLensAnalysis().run(model, ids, position=-1)
    assert lens.points[-1].top[0].token_id == int(model.forward(ids).output[0, -1].argmax())
    clean, corrupt = zm_ids(1, 8, seed=4), zm_ids(1, 8, seed=5)
    top = int(model.forward(clean).output[0, -1].argmax())
    metric = logit_diff_metric(top, (top + 1) % model.vocab_size)
    last = patching_grid(model, clean, corrupt, metric, "resid_post",
                         layers=[model.num_layers - 1], positions=[-1], show_progress=False)
    assert abs(float(last.grid[0, 0]) - 1.0) < 1e-4


def test_decomposition_sums_zamba2s_mixer_outputs_and_refuses_minimax() -> None:
    model = zm_model("zamba2")
    cache = run_for_decomposition(model, zm_ids(1, 9, seed=6))
    stack, labels = decompose_resid(cache, model.num_layers)
    # the shared block feeds the mixer's input: each layer adds only its mixer's output
    assert labels == ["embed"] + [f"{i}_mixer" for i in range(model.num_layers)]
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    assert (stack.sum(0) - final).abs().max().item() < 1e-4
    minimax = zm_model("minimax")
    with pytest.raises(mi.CapabilityError, match="final residual to be the embedding plus"):
        run_for_decomposition(minimax, zm_ids(1, 9))
    _, tl_cache = minimax.run_with_cache(zm_ids(1, 5))
    with pytest.raises(mi.CapabilityError, match="norm's output"):
        tl_cache.decompose_resid()


def test_an_sae_splices_into_a_mixer_point(rep, tmp_path: Path) -> None:
    from tests.support.sae_tiny_backend import write_saelens_sae

    model = zm_model(rep)
    _, rec, _ = LAYERS[rep]
    point = f"blocks.{rec}.{'ssm' if rep == 'zamba2' else 'attn'}.hook_in"
    sae = mi.load_dictionary(write_saelens_sae(tmp_path / "sae", point, model.hidden_size, 48))
    ids = zm_ids(1, 6)
    plain = model.forward(ids).output
    spliced = model.forward(ids, sae.splice(mi.HookSpec(), model=model)).output
    assert (spliced - plain).abs().max().item() > 1e-3
    exact = model.forward(ids, sae.splice(mi.HookSpec(), include_error=True, model=model)).output
    assert (exact - plain).abs().max().item() < 1e-4


def test_the_attention_view_reads_each_layers_own_attention(rep, tmp_path: Path) -> None:
    from mi_core.viz import effective_attention_html

    model = zm_model(rep)
    attn, rec, eff = LAYERS[rep]
    pat, point = layer_attention(model, zm_ids(1, 7), attn)
    assert point.name == f"blocks.{attn}.attn.hook_pattern"  # (Zamba2: the shared block's)
    assert (pat.sum(-1) - 1).abs().max().item() < 1e-5  # a softmax pattern
    a, point = layer_attention(model, zm_ids(1, 7), rec)
    assert point.name == f"blocks.{rec}.{eff}" and a.shape[-2:] == (7, 7)
    page = effective_attention_html([f"t{i}" for i in range(7)], a[0], tmp_path / "a.html", rec)
    assert "effective attention" in page.read_text()


@pytest.mark.usefixtures("one_torch_thread")
def test_an_inplace_edit_at_any_point_equals_returning_it(rep) -> None:
    model = zm_model(rep)
    bad = inplace_mismatches(model, zm_ids(2, 5, seed=7))
    assert not bad, "\n".join(bad)
