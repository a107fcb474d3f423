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
