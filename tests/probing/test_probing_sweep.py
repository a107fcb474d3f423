"""Many hook points on the toy model: the sweep, its curve JSON and picture."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import mi_core as mi
from mi_core.serialize import from_json, to_json
from mi_probing import (
    LabelledDataset,
    ProbingError,
    SweepResult,
    expand_hooks,
    layer_hooks,
    plot_sweep,
    probe_model,
)
from tests.support.probing_toy import LABELS, TEXTS

DATA = LabelledDataset.from_lists(TEXTS, LABELS, source="toy-sentiment")


def test_sweep_probes_every_layer_and_reads_the_label_from_the_last_token(toy_model):
    hooks = ["hook_embed"] + layer_hooks(toy_model)
    result = probe_model(toy_model, DATA, hooks, position="last", n_shuffles=2, cv=3,
                         progress=False)
    assert [c.hook for c in result.curve] == hooks
    assert [c.layer for c in result.curve] == [None, 0, 1, 2]
    assert result.metric == "accuracy" and result.task == "binary"
    embed = result.probe("hook_embed").score()
    # four distinct embeddings, each in every training fold: every test row is classified
    assert embed.value == 1.0 and embed.baseline is not None and embed.baseline < 0.8
    assert result.best().score().value == 1.0


def test_sweep_result_round_trips_through_mi_core_serialize(toy_model, tmp_path: Path):
    result = probe_model(toy_model, DATA, layer_hooks(toy_model, layers=[0, 2]), n_shuffles=1,
                         cv=2, progress=False)
    again = from_json(to_json(result, tmp_path / "r.json"), SweepResult)
    assert again == result
    assert from_json(tmp_path / "r.json", SweepResult) == result


def test_plot_writes_a_png_of_the_curve(toy_model, tmp_path: Path):
    result = probe_model(toy_model, DATA, ["hook_embed", "blocks.1.hook_resid_post"],
                         n_shuffles=1, cv=2, progress=False)
    out = plot_sweep(result, tmp_path / "curve.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_plot_without_matplotlib_says_how_to_install_it(toy_model, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    result = probe_model(toy_model, DATA, ["hook_embed"], n_shuffles=0, cv=2, progress=False)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import now fails
    with pytest.raises(ProbingError, match=r"matplotlib: pip install 'mi-core\[plot\]'"):
        plot_sweep(result, tmp_path / "x.png")


def test_wildcards_expand_over_the_models_points_in_order(toy_model):
    assert expand_hooks(toy_model, ["blocks.*.hook_resid_post", "hook_embed"]) == \
        ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "blocks.2.hook_resid_post",
         "hook_embed"]
    with pytest.raises(mi.HookError, match="matches no hook point"):
        expand_hooks(toy_model, ["blocks.*.mlp.hook_post"])


def test_one_class_dataset_fails_before_the_model_runs(toy_model):
    one = LabelledDataset.from_lists(TEXTS[:6], ["pos"] * 6, source="one.jsonl")
    with pytest.raises(ProbingError, match="one.jsonl: all 6 examples have the label 'pos'"):
        probe_model(toy_model, one, ["hook_embed"], progress=False)
    assert toy_model.backend.forward_calls == 0
