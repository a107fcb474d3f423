"""The HTML views without a browser: one self-contained file, the embedded data equal to
the inputs, tokens that look like markup kept inert, bad input refused; and the
layers x positions logit lens against the single-position analysis."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from mi_core.errors import ConfigError
from mi_core.interp import LogitLensAnalysis, logit_lens_grid
from mi_core.viz import (
    attention_html, attribution_graph_html, feature_activations_html, logit_lens_html,
)
from mi_core.viz._page import embed_json

NASTY = ["<s>", "</script><script>window.PWNED=1</script>", '"&amp;', "<!--", "\n", " "]


def page_data(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    m = re.search(r"<script type='application/json' id='mi-data'>(.*?)</script>", text, re.S)
    assert m, "no data block"
    return json.loads(m.group(1))


def f32(t: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(t["b64"]), dtype="<f4").reshape(t["shape"])


def test_page_is_one_self_contained_file_with_markup_tokens_inert(tmp_path: Path) -> None:
    pat = torch.softmax(torch.randn(2, 6, 6), -1)
    out = attention_html(NASTY, pat, tmp_path / "a.html", layer=0)
    text = out.read_text(encoding="utf-8")
    # exactly the two script blocks we write: the data and the code; nothing fetched
    assert len(re.findall(r"<script\b", text)) == 2
    markup = re.sub(r"<script\b.*?</script>", "", text, flags=re.S)
    assert not re.search(r"\b(src|href)\s*=|<link\b|@import|url\(", markup)
    code = re.findall(r"<script>(.*?)</script>", text, re.S)[0]
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)|fetch\(|XMLHttpRequest|import\(", code)
    assert "PWNED=1</script>" not in text and "<!--" not in text
    data = page_data(out)
    assert data["tokens"] == NASTY
    np.testing.assert_array_equal(f32(data["pattern"]), pat.numpy())  # float32, bit-exact


def test_embed_json_escapes_what_could_end_a_script_block() -> None:
    s = embed_json({"t": "</script>&<!--\u2028"})
    assert "<" not in s and ">" not in s and "&" not in s and "\u2028" not in s
    assert json.loads(s) == {"t": "</script>&<!--\u2028"}


def test_views_refuse_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must end in .html"):
        attention_html(["a", "b"], torch.ones(1, 2, 2), tmp_path / "a.png")
    with pytest.raises(ConfigError, match=r"\[heads, 3, 3\]"):
        attention_html(["a", "b", "c"], torch.ones(1, 2, 2), tmp_path / "a.html")
    with pytest.raises(ConfigError, match="features"):
        feature_activations_html(["a", "b"], torch.ones(3, 4), tmp_path / "f.html")
    with pytest.raises(ConfigError, match="outside 0..1"):
        attribution_graph_html(tmp_path / "g.html", ["a"], 1,
                               [{"kind": "token", "pos": 0}, {"kind": "logit", "pos": 0}],
                               [0], [2], [1.0])
    with pytest.raises(ConfigError, match="kind 'neuron'"):
        attribution_graph_html(tmp_path / "g.html", ["a"], 1, [{"kind": "neuron", "pos": 0}],
                               [], [], [])


def test_feature_page_keeps_only_active_features_largest_first(tmp_path: Path) -> None:
    acts = torch.zeros(3, 10)
    acts[0, 7], acts[2, 2], acts[1, 5] = 2.0, 5.0, -1.0
    data = page_data(feature_activations_html(["x", "y", "z"], acts, tmp_path / "f.html"))
    assert data["labels"] == ["2", "7", "5"]
    np.testing.assert_array_equal(f32(data["acts"]), acts[:, [2, 7, 5]].numpy())


def test_lens_grid_equals_the_single_position_lens_at_every_position(tiny) -> None:
    prompt = "w3 w17 w5 w9 w21"
    grid = logit_lens_grid(tiny, prompt, k=4, include_mid=True, targets=["w5"])
    ids = tiny.to_tokens(prompt)
    seq = ids.shape[1]
    assert grid.top_ids.shape == (2 * tiny.num_layers, seq, 4)
    for pos in range(seq):
        ref = LogitLensAnalysis(k=4, include_mid=True, targets=["w5"]).run(tiny, prompt, pos)
        assert grid.labels == [p.label for p in ref.points]
        for r, p in enumerate(ref.points):
            assert grid.top_ids[r, pos].tolist() == [t.token_id for t in p.top]
            torch.testing.assert_close(grid.top_probs[r, pos], torch.tensor([t.prob for t in p.top]),
                                       atol=1e-6, rtol=0)
            assert float(grid.target_probs[r, pos, 0]) == pytest.approx(p.targets[0].prob, abs=1e-6)
            assert int(grid.target_ranks[r, pos, 0]) == p.targets[0].rank
    # the last lens point is the model's own output distribution (independent of the lens code)
    probs = torch.softmax(tiny.forward(ids).output[0].float(), -1)
    torch.testing.assert_close(grid.top_probs[-1], probs.topk(4, -1).values, atol=1e-5, rtol=0)


def test_single_position_lens_page_has_one_column(tiny, tmp_path: Path) -> None:
    r = LogitLensAnalysis(k=3).run(tiny, "w3 w17 w5", -1)
    data = page_data(logit_lens_html(r, tmp_path / "l.html"))
    assert data["positions"] == [r.position] and len(data["labels"]) == len(r.points)
    assert data["top_ids"][0][0] == [t.token_id for t in r.points[0].top]


def test_sparse_activations_page_equals_the_dense_columns(tmp_path: Path) -> None:
    import mi_core as mi

    g = torch.Generator().manual_seed(3)
    dense = torch.relu(torch.randn(4, 1000, generator=g))
    vals, idx = dense.topk(3, -1)
    sa = mi.SparseActivations(idx, vals, 1000)
    data = page_data(sa.to_html(tmp_path / "s.html", ["a", "b", "c", "d"]))
    ref = sa.to_dense()  # [4, d_sae], the library's own dense form
    cols = [int(x) for x in data["labels"]]
    assert sorted(cols) == sorted(set(idx.flatten().tolist()))
    np.testing.assert_array_equal(f32(data["acts"]), ref[:, cols].numpy())
    # reachable as mi.viz without importing the submodule
    assert mi.viz.sparse_activations_html is not None
