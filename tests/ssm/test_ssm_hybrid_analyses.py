"""The analyses and views on a representative of each hybrid group (Jamba: Mamba-1 +
attention + MoE; Granite 4.0-H: Mamba-2 + attention + MoE with a shared MLP and Granite's
multipliers; Nemotron-H: one sublayer per layer, MLP-only layers): attention knockout on
the attention layers beside state knockout on the mixer ones, steering of both kinds, logit
lens, patching, decomposition, SAE splicing, the attention view reading a softmax pattern or
an effective attention per layer."""

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

from tests.support.hybrid_tiny import HYBRID_LAYER_TYPES, hybrid_model
from tests.support.ssm_tiny import ssm_ids

GROUPS = ["jamba", "granitemoehybrid", "nemotron_h"]


@pytest.fixture(params=GROUPS)
def rep(request: pytest.FixtureRequest) -> str:
    return request.param


def _layers(name: str) -> tuple[int, int]:
    """(an attention layer, a mixer layer) of the tiny checkpoint."""
    types = HYBRID_LAYER_TYPES[name]
    return types.index("full_attention"), next(i for i, t in enumerate(types)
                                               if t != "full_attention")


def test_attention_knockout_on_attention_layers_and_state_knockout_on_the_others(rep) -> None:
    model = hybrid_model(rep)
    attn, mix = _layers(rep)
    ids = ssm_ids(1, 8, seed=1)
    plain = model.forward(ids).output
    hooks = knockout_hooks(model, KnockoutSpec(layers=[attn], from_positions=[-1],
                                               to_positions=[0, 1, 2]), 8)
    out = model.forward(ids, hooks).output
    assert (out - plain)[:, :-1].abs().max().item() < 1e-5  # only the last query row changes
    assert (out - plain)[:, -1].abs().max().item() > 1e-4
    with pytest.raises(mi.HookError, match=f"layer {mix} is a '{model.layer_types[mix]}' layer"):
        knockout_hooks(model, KnockoutSpec(layers=[mix], from_positions=[-1],
                                           to_positions=[0]), 8)
    ko = run_state_knockout(model, ids, mi.StateKnockoutSpec(positions=[3]))
    assert ko.kl_divergence() > 0 and ko.kl_per_position()[:3].abs().max() == 0


def test_attention_and_residual_steering(rep) -> None:
    model = hybrid_model(rep)
    attn, mix = _layers(rep)
    ids = ssm_ids(1, 8, seed=2)
    r = apply_steering(model, ids, SteeringSpec.attention([attn], to_positions=[0], scale=4.0))
    assert r.steered_attention > r.baseline_attention
    d = torch.randn(model.hidden_size, generator=torch.Generator().manual_seed(0))
    r = apply_steering(model, ids, SteeringSpec.residual([mix], d, strength=3.0))
    assert (r.steered_logits - r.baseline_logits).abs().max().item() > 1e-3


def test_logit_lens_patching_and_decomposition(rep) -> None:
    model = hybrid_model(rep)
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
    kinds = [{"full_attention": ["attn"], "mlp": ["mlp"]}.get(t, ["mixer"])
             for t in HYBRID_LAYER_TYPES[rep]]
    if rep != "nemotron_h":  # the others: every layer's mixer or attention, then its MLP
        kinds = [k + ["mlp"] for k in kinds]
    assert labels == ["embed"] + [f"{i}_{k}" for i, ks in enumerate(kinds) for k in ks]
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    assert (stack.sum(0) - final).abs().max().item() < 1e-4


def test_an_sae_splices_into_a_mixer_point(rep, tmp_path: Path) -> None:
    from tests.support.sae_tiny_backend import write_saelens_sae

    model = hybrid_model(rep)
    _, mix = _layers(rep)
    sae = mi.load_dictionary(write_saelens_sae(tmp_path / "sae", f"blocks.{mix}.ssm.hook_in",
                                               model.hidden_size, 48))
    ids = ssm_ids(1, 6)
    plain = model.forward(ids).output
    spliced = model.forward(ids, sae.splice(mi.HookSpec(), model=model)).output
    assert (spliced - plain).abs().max().item() > 1e-3
    exact = model.forward(ids, sae.splice(mi.HookSpec(), include_error=True, model=model)).output
    assert (exact - plain).abs().max().item() < 1e-4


def test_the_attention_view_reads_each_layers_own_attention(rep, tmp_path: Path) -> None:
    from mi_core.viz import effective_attention_html

    model = hybrid_model(rep)
    attn, mix = _layers(rep)
    pat, point = layer_attention(model, ssm_ids(1, 7), attn)
    assert point.name == f"blocks.{attn}.attn.hook_pattern"
    assert (pat.sum(-1) - 1).abs().max().item() < 1e-5  # a softmax pattern
    a, point = layer_attention(model, ssm_ids(1, 7), mix)
    assert point.name == f"blocks.{mix}.ssm.hook_effective_attn" and a.shape[-2:] == (7, 7)
    page = effective_attention_html([f"t{i}" for i in range(7)], a[0], tmp_path / "a.html", mix)
    assert "effective attention" in page.read_text()
