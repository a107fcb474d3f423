"""The analyses and views on a linear-attention hybrid (Qwen3-Next: gated DeltaNet layers
0-2, gated attention layer 3, MoE MLPs): state knockout on the recurrent layers and attention
knockout on the attention layer side by side, steering, logit lens, patching, decomposition,
SAE splicing, the attention view (pattern) and the effective-attention view."""

from __future__ import annotations

from pathlib import Path

import torch

import mi_core as mi
from mi_core.interp import (
    KnockoutSpec, LogitLensAnalysis, decompose_resid, layer_attention, logit_diff_metric,
    patching_grid, run_for_decomposition, run_knockout, run_state_knockout, run_state_steering,
)

from tests.support.linear_tiny import linear_model, tiny_linear  # noqa: F401
from tests.support.ssm_tiny import ssm_ids

NAME = "qwen3_next"


def test_state_knockout_and_attention_knockout_side_by_side(linear_model) -> None:
    model = linear_model(NAME)
    ids = ssm_ids(1, 9, seed=1)
    ko = run_state_knockout(model, ids, mi.StateKnockoutSpec(positions=[3]))  # layers 0-2
    assert ko.kl_divergence() > 0 and ko.kl_per_position()[:3].abs().max() == 0
    attn = run_knockout(model, ids, KnockoutSpec(from_positions=[-1], to_positions=[3]).layer(3))
    assert (attn.ablated_logits - attn.baseline_logits).abs().max().item() > 0
    st = run_state_steering(model, ids, mi.StateSteeringSpec(1.0, positions=[3]))
    assert st.max_abs_logit_diff() == 0.0  # scale 1 is a no-op


def test_logit_lens_and_patching_run_on_the_hybrid(linear_model) -> None:
    model = linear_model(NAME)
    ids = ssm_ids(1, 7)
    r = LogitLensAnalysis().run(model, ids, position=-1)
    assert r.points[-1].top[0].token_id == int(model.forward(ids).output[0, -1].argmax())
    clean, corrupt = ssm_ids(1, 8, seed=1), ssm_ids(1, 8, seed=2)
    top = int(model.forward(clean).output[0, -1].argmax())
    metric = logit_diff_metric(top, (top + 1) % model.vocab_size)
    last = patching_grid(model, clean, corrupt, metric, "resid_post",
                         layers=[model.num_layers - 1], positions=[-1], show_progress=False)
    assert abs(float(last.grid[0, 0]) - 1.0) < 1e-4
    grid = patching_grid(model, clean, corrupt, metric, "resid_pre", show_progress=False)
    assert grid.grid.shape[0] == model.num_layers


def test_decomposition_sums_mixer_attention_and_mlp_outputs_to_the_residual(
        linear_model) -> None:
    model = linear_model(NAME)
    cache = run_for_decomposition(model, ssm_ids(1, 9, seed=3))
    stack, labels = decompose_resid(cache, model.num_layers)
    assert labels[:3] == ["embed", "0_mixer", "0_mlp"] and "3_attn" in labels
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    assert (stack.sum(0) - final).abs().max().item() < 1e-4
    _, tl = model.run_with_cache(ssm_ids(1, 9, seed=3))
    assert "blocks.0.attn.hook_state" not in tl and "blocks.0.attn.hook_z" in tl  # opt-in


def test_an_sae_splices_into_the_deltanet_input_and_its_error_term_restores_the_output(
        linear_model, tmp_path: Path) -> None:
    from tests.support.sae_tiny_backend import write_saelens_sae

    model = linear_model(NAME)
    sae = mi.load_dictionary(write_saelens_sae(tmp_path / "sae", "blocks.1.attn.hook_in",
                                               model.hidden_size, 48))
    ids = ssm_ids(1, 6)
    plain = model.forward(ids).output
    assert (model.forward(ids, sae.splice(mi.HookSpec(), model=model)).output
            - plain).abs().max().item() > 1e-3
    exact = model.forward(ids, sae.splice(mi.HookSpec(), include_error=True, model=model)).output
    assert (exact - plain).abs().max().item() < 1e-4


def test_the_attention_view_reads_the_pattern_or_the_effective_attention(
        linear_model, tmp_path: Path) -> None:
    model = linear_model(NAME)
    a, point = layer_attention(model, ssm_ids(1, 7), 0)
    assert point.name == "blocks.0.attn.hook_effective_attn" and a.shape == (1, 4, 7, 7)
    p, point = layer_attention(model, ssm_ids(1, 7), 3)
    assert point.name == "blocks.3.attn.hook_pattern" and p.shape == (1, 4, 7, 7)
    assert torch.allclose(p.sum(-1), torch.ones(1, 4, 7))
    from mi_core.viz import effective_attention_html

    page = effective_attention_html([f"t{i}" for i in range(7)], a[0], tmp_path / "a.html", 0)
    assert "effective attention" in page.read_text()
