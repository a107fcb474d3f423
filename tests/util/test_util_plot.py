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
    assert png_size(plot.plot_patching(r, tmp_path / "p.png")) == (800, 600)
    lens = LogitLensAnalysis(k=3).run(model, "abc")
    assert png_size(plot.plot_logit_lens(lens, tmp_path / "l.png", figsize=(5, 4))) == (500, 400)
    curve = dose_response(model, "abc", SteeringSpec.attention([0], to_positions=[0]), [0, 1, 2], target=5)
    assert png_size(plot.plot_dose_response(curve, tmp_path / "d.png")) == (600, 400)
    for name in ("p.png", "l.png", "d.png"):
        assert _decode(tmp_path / name).std() > 0.01


def test_html_report_is_self_contained(tmp_path):
    png = plot.plot_grid(torch.randn(3, 4), list("abc"), list("wxyz"), tmp_path / "g.png", figsize=(3, 2))
    assert png_size(png) == (300, 200)
    h = plot.html_report([("grid", png), ("notes", "<b>x</b>")], tmp_path / "r.html")
    text = h.read_text()
    assert "data:image/png;base64," in text and "&lt;b&gt;x&lt;/b&gt;" in text
    assert "src='http" not in text and 'src="http' not in text
