"""Pictures are real PNGs of the expected pixel size; the HTML report embeds them."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from mi_core.util import plot


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _decode(path: Path):
    import matplotlib.image as mpimg

    return mpimg.imread(path)


@pytest.fixture(scope="module")
def model():
    from tests.support.fake_backend import fake_model

    return fake_model()


def test_attention_heatmap(tmp_path):
    pat = torch.softmax(torch.randn(2, 5, 5), -1)
    p = plot.plot_attention(pat, list("abcde"), tmp_path / "a.png", figsize=(4, 3))
    assert png_size(p) == (400, 300)
    img = _decode(p)
    assert img.shape[:2] == (300, 400) and img.std() > 0.01  # not blank


def test_patching_grid_lens_and_dose_pictures(tmp_path, model):
    from mi_core.interp import (
        LogitLensAnalysis, SteeringSpec, dose_response, logit_diff_metric, patching_grid,
    )

    r = patching_grid(model, "hello", "jello", logit_diff_metric(3, 4), "resid_pre")
    assert png_size(plot.plot_patching(r, tmp_path / "p.png", figsize=(8, 6))) == (800, 600)
    lens = LogitLensAnalysis(k=3).run(model, "abc")
    assert png_size(plot.plot_logit_lens(lens, tmp_path / "l.png", figsize=(5, 4))) == (500, 400)
    curve = dose_response(model, "abc", SteeringSpec.attention([0], to_positions=[0]), [0, 1, 2], target=5)
    assert png_size(plot.plot_dose_response(curve, tmp_path / "d.png", figsize=(6, 4))) == (600, 400)
    for name in ("p.png", "l.png", "d.png"):
        assert _decode(tmp_path / name).std() > 0.01


def test_html_report_is_self_contained_with_one_heading_and_the_prompt(tmp_path):
    png = plot.plot_grid(torch.randn(3, 4), list("abc"), list("wxyz"), tmp_path / "g.png", figsize=(3, 2))
    assert png_size(png) == (300, 200)
    h = plot.html_report([("lens", png), ("notes", "<b>x</b>")], tmp_path / "r.html",
                         title="lens", prompt="The <capital>")
    text = h.read_text()
    assert "data:image/png;base64," in text and "&lt;b&gt;x&lt;/b&gt;" in text
    assert "src='http" not in text and 'src="http' not in text
    assert text.count(">lens</h") == 1 and "The &lt;capital&gt;" in text


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_the_extension_chooses_the_format(tmp_path, suffix, magic):
    out = plot.plot_grid(torch.randn(2, 2), ["a", "b"], ["c", "d"], tmp_path / f"g{suffix}")
    assert out.read_bytes().startswith(magic)


@pytest.mark.parametrize("name", ["g.jpg", "g", "g.html"])
def test_any_other_extension_is_an_error_before_drawing(tmp_path, name):
    import mi_core as mi

    with pytest.raises(mi.ConfigError, match="chosen by the extension"):
        plot.plot_grid(torch.randn(2, 2), ["a", "b"], ["c", "d"], tmp_path / name)
    assert not (tmp_path / name).exists()


def test_figure_size_grows_with_rows_and_columns(tmp_path):
    small = png_size(plot.plot_attention(torch.eye(4), list("abcd"), tmp_path / "s.png"))
    big = png_size(plot.plot_attention(torch.eye(40), [f"t{i}" for i in range(40)], tmp_path / "b.png"))
    assert big[0] > small[0] * 2 and big[1] > small[1] * 2


def test_probabilities_use_a_sequential_scale_and_effects_a_diverging_one(tmp_path, model):
    """Pixel colours: the lowest probability is (near) white, not the middle of a diverging
    map; a signed grid's zero is white and its extremes differ in hue."""
    img = _decode(plot.plot_grid(torch.tensor([[0.0, 1.0]]), ["r"], ["lo", "hi"], tmp_path / "p.png",
                                 signed=False, figsize=(4, 3)))
    h, w = img.shape[:2]
    assert img.shape[2] >= 3
    import matplotlib

    blues = matplotlib.colormaps["Blues"]
    row = img[h // 2]
    assert any(abs(px[:3] - blues(0.0)[:3]).max() < 0.02 for px in row)  # p = 0: lightest blue
    assert any(abs(px[:3] - blues(1.0)[:3]).max() < 0.02 for px in row)  # p = 1: darkest


@pytest.fixture
def drawn(monkeypatch):
    """Every figure a plot function saves, kept open for inspection (and still written)."""
    from mi_core.util.plot import _base, graph, scores

    figs = []

    def keep(fig, path):
        figs.append(fig)
        fig.savefig(path, format=_base.picture_format(path))
        return Path(path)
    for mod in (plot, graph, scores):
        monkeypatch.setattr(mod, "save_figure", keep)
    return figs


def _texts(fig) -> str:
    parts = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        parts += [t.get_text() for t in ax.texts]
        if ax.get_legend():
            parts += [t.get_text() for t in ax.get_legend().get_texts()]
    return "\n".join(parts)


def test_each_picture_names_what_was_done_and_no_repr(tmp_path, model, drawn):
    import mi_core as mi
    from mi_core.interp import KnockoutSpec, SteeringSpec, dose_response, run_knockout

    ko = run_knockout(model, "hello", KnockoutSpec(layers=[0, 1], from_positions=[-1],
                                                   to_positions=[1]))
    plot.plot_knockout(ko, tmp_path / "k.png")
    v = torch.randn(model.hidden_size)
    curve = dose_response(model, "hello", SteeringSpec.residual([1], v, positions=[2]),
                          [0.0, 1.0], target=5)
    plot.plot_dose_response(curve, tmp_path / "d.png")
    ko_text, dose_text = _texts(drawn[0]), _texts(drawn[1])
    assert "attention knockout, fake" in ko_text and "prompt 'hello'" in ko_text
    assert "layers 0,1, all heads; removed edges query \u2192 key: 5 'o' \u2192 1 'h'" in ko_text
    assert "dose-response of residual steering, fake" in dose_text
    assert f"add s \u00d7 direction ({model.hidden_size}-d" in dose_text
    assert "blocks.1.hook_resid_pre at position 2 'e'" in dose_text
    for text in (ko_text, dose_text):
        assert "Spec(" not in text and "tensor(" not in text


def test_patching_picture_names_the_metric_and_its_units(tmp_path, model, drawn):
    from mi_core.interp import logit_diff_metric, patching_grid

    r = patching_grid(model, "hello", "jello", logit_diff_metric(3, 4), layers=[0, 2])
    plot.plot_patching(r, tmp_path / "p.png")
    text = _texts(drawn[0]) + "\n".join(a.get_ylabel() for a in drawn[0].axes)
    assert "metric logit('\\x02') \u2212 logit('\\x03') (logits)" in text
    assert "normalised logit('\\x02') \u2212 logit('\\x03') (logits)" in text


def test_the_lens_picture_draws_the_target_probability_and_rank(tmp_path, model, drawn):
    from mi_core.interp import LogitLensAnalysis

    lens = LogitLensAnalysis(k=3, targets=[5]).run(model, "abc")
    plot.plot_logit_lens(lens, tmp_path / "l.png")
    fig = drawn[0]
    panel = next(a for a in fig.axes if a.get_title() == "tracked tokens")
    line = panel.get_lines()[0]
    assert list(line.get_xdata()) == pytest.approx([p.targets[0].prob for p in lens.points])
    ranks = {t.get_text() for t in panel.texts}
    assert ranks <= {f"#{p.targets[0].rank + 1}" for p in lens.points}
    assert "rank 1" in [t.get_text() for t in fig.axes[0].get_xticklabels()]


def test_head_scores_picture_draws_all_three_kinds(tmp_path, model, drawn):
    from mi_core.interp import detect_heads

    r = detect_heads(model)
    plot.plot_head_scores(r, tmp_path / "h.png")
    titles = [a.get_title() for a in drawn[0].axes]
    for kind in ("previous-token", "duplicate-token", "induction"):
        assert any(t.startswith(kind) for t in titles)
    assert "measured on 4 x random tokens repeated once" in _texts(drawn[0])


def test_graph_picture_aligns_token_labels_with_columns_and_has_a_legend(tmp_path, drawn):
    nodes = [{"kind": "token", "pos": p} for p in range(3)]
    nodes += [{"kind": "feature", "layer": 0, "pos": 2} for _ in range(5)]
    nodes += [{"kind": "logit", "top_tokens": [(f" t{j}", 0.1)]} for j in range(6)]
    plot.plot_attribution_graph(tmp_path / "g.png", ["a", " b", "\u202ec"], 1, nodes,
                                [0, 3, 4], [3, 8, 9], [1.0, -0.5, 0.2])
    ax = drawn[0].axes[0]
    assert list(ax.get_xticks()) == [0, 1, 2]  # a tick at each column's centre
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == \
        ["'a'", "' b'", "'\\u202ec'"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["feature", "error node", "token embedding", "logit", "positive edge",
                      "negative edge"]
    logit_x = [t.xy[0] for t in ax.texts]
    assert len(set(logit_x)) == 6 and [t.get_text() for t in ax.texts] == \
        [f"' t{j}'" for j in range(6)]


def test_the_sweep_aggregate_shows_log_prob_first_and_the_raw_logit_beside(tmp_path, drawn):
    agg = {"analysis": "knockout", "n": 3, "rows": [0, 1, 2], "row_label": "layer",
           "metric": "answer logit change (knocked out - baseline)", "cols": None,
           "mean": [-1.0, -2.0, 0.5], "std": [0.1, 0.2, 0.1],
           "logprob_mean": [-0.5, -1.5, 0.1], "logprob_std": [0.1, 0.1, 0.1], "model": "m"}
    plot.plot_sweep_aggregate(agg, tmp_path / "a.png")
    axes = drawn[0].axes
    assert axes[0].get_ylabel().startswith("\u0394 log p(answer), nats")
    assert axes[1].get_ylabel().startswith("\u0394 logit(answer), raw")
    assert list(axes[0].get_lines()[0].get_ydata()) == [-0.5, -1.5, 0.1]
    assert "knockout sweep over 3 prompts, m" in _texts(drawn[0])
