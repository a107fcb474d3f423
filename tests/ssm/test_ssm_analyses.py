"""The analyses and views on state-space models: attention knockout refused naming the layer,
logit lens, patching, decomposition, SAE splicing, the attention view on effective attention,
the CLI's attention command, TransformerLens' cache conveniences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    KnockoutSpec, LogitLensAnalysis, decompose_resid, knockout_hooks, layer_attention,
    logit_diff_metric, patching_grid, run_for_decomposition,
)

from tests.support.ssm_tiny import ssm_ids


def test_attention_knockout_is_refused_naming_the_layer_and_its_mixer(ssm_model) -> None:
    model = ssm_model("mamba2")
    with pytest.raises(mi.HookError, match=r"attention knockout needs .*blocks\.0\.attn\."
                                           r"hook_attn_scores.*layer 0 is a 'mamba2' layer"):
        knockout_hooks(model, KnockoutSpec(from_positions=[-1], to_positions=[0]), 5)
    # a raw capture of an attention point there says what the layer is, before any compute
    with pytest.raises(mi.HookError, match=r"blocks\.1\.attn\.hook_pattern.*"
                                           r"layer 1 is a 'mamba2' layer"):
        model.forward(ssm_ids(1, 4), mi.HookSpec().capture("blocks.1.attn.hook_pattern"))


def test_logit_lens_reads_every_layer(ssm_model) -> None:
    model = ssm_model("mamba")
    ids = ssm_ids(1, 7)
    r = LogitLensAnalysis().run(model, ids, position=-1)
    assert [p.point for p in r.points] == [f"blocks.{i}.hook_resid_post"
                                           for i in range(model.num_layers)]
    # the last layer's lens is the model's own output (final norm + head)
    assert r.points[-1].top[0].token_id == int(model.forward(ids).output[0, -1].argmax())


def test_residual_patching_of_the_clean_run_restores_the_clean_metric(ssm_model) -> None:
    model = ssm_model("mamba2")
    clean, corrupt = ssm_ids(1, 8, seed=1), ssm_ids(1, 8, seed=2)
    top = int(model.forward(clean).output[0, -1].argmax())
    other = (top + 1) % model.vocab_size
    for kind in ("resid_pre", "mixer_out"):
        grid = patching_grid(model, clean, corrupt, logit_diff_metric(top, other), kind,
                             positions=[-1] if kind == "mixer_out" else None,
                             show_progress=False)
        assert grid.grid.shape[0] == model.num_layers
    # patching the last position of the last layer's output restores the clean logits there
    last = patching_grid(model, clean, corrupt, logit_diff_metric(top, other), "resid_post",
                         layers=[model.num_layers - 1], positions=[-1], show_progress=False)
    assert abs(float(last.grid[0, 0]) - 1.0) < 1e-4


def test_decomposition_sums_the_mixer_outputs_to_the_final_residual(family, ssm_model) -> None:
    model = ssm_model(family)
    cache = run_for_decomposition(model, ssm_ids(1, 9, seed=3))
    stack, labels = decompose_resid(cache, model.num_layers)
    assert labels == ["embed"] + [f"{i}_mixer" for i in range(model.num_layers)]
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    assert (stack.sum(0) - final).abs().max().item() < 1e-4
    logits, tl = model.run_with_cache(ssm_ids(1, 9, seed=3))
    # the per-step states and effective attention are opt-in (large): hooked by name only
    assert "blocks.0.ssm.hook_state" not in tl and "blocks.0.ssm.hook_y" in tl
    _, named = model.run_with_cache(ssm_ids(1, 9), names_filter="blocks.0.ssm.hook_state")
    assert tuple(named["blocks.0.ssm.hook_state"].shape)[:2] == (1, 9)
    # a callable filter that accepts them captures them (never an empty cache for it)
    _, chosen = model.run_with_cache(ssm_ids(1, 9), names_filter=lambda n: "effective" in n)
    assert sorted(chosen.keys()) == [f"blocks.{i}.ssm.hook_effective_attn"
                                     for i in range(model.num_layers)]
    parts, names = tl.decompose_resid(return_labels=True)
    assert names == ["embed"] + [f"{i}_mixer_out" for i in range(model.num_layers)]
    assert (parts.sum(0) - final).abs().max().item() < 1e-4


def test_an_sae_splices_into_a_mixer_point_and_its_error_term_restores_the_output(
        ssm_model, tmp_path: Path) -> None:
    """A SAELens-format SAE on ``ssm.hook_in`` (the mixer's input): the reconstruction changes
    the logits; with the error term added they are the model's own."""
    from tests.support.sae_tiny_backend import write_saelens_sae

    model = ssm_model("mamba")
    sae = mi.load_dictionary(write_saelens_sae(tmp_path / "sae", "blocks.1.ssm.hook_in",
                                               model.hidden_size, 48))
    ids = ssm_ids(1, 6)
    plain = model.forward(ids).output
    spliced = model.forward(ids, sae.splice(mi.HookSpec(), model=model)).output
    assert (spliced - plain).abs().max().item() > 1e-3
    exact = model.forward(ids, sae.splice(mi.HookSpec(), include_error=True, model=model)).output
    assert (exact - plain).abs().max().item() < 1e-4


def test_the_attention_view_draws_effective_attention(ssm_model, tmp_path: Path) -> None:
    model = ssm_model("mamba2")
    a, point = layer_attention(model, ssm_ids(1, 7), 1)
    assert point.name == "blocks.1.ssm.hook_effective_attn" and a.shape == (1, 8, 7, 7)
    from mi_core.viz import effective_attention_html

    page = effective_attention_html([f"t{i}" for i in range(7)], a[0], tmp_path / "a.html", 1)
    data = page.read_text()
    assert "effective attention" in data and page.stat().st_size > 1000


def test_the_attention_command_falls_back_to_effective_attention(tiny_ssm, tmp_path: Path,
                                                                 capsys) -> None:
    import shutil

    from mi_cli.main import main
    from tests.support.bad_files import write_word_tokenizer

    model_dir = tmp_path / "mamba"
    shutil.copytree(tiny_ssm("mamba").path, model_dir)
    write_word_tokenizer(model_dir)
    out = tmp_path / "attn.json"
    assert main(["attention", "--model", str(model_dir), "--prompt", "a b c a b", "--layer",
                 "1", "--json", str(out), "--plot", str(tmp_path / "a.html")]) == 0
    said = capsys.readouterr().out
    assert "effective attention" in said
    assert json.loads(out.read_text())["layer"] == 1
    assert "effective attention" in (tmp_path / "a.html").read_text()
