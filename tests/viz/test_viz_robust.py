"""Pages are robust (without a browser): any Unicode a tokenizer can produce is written
safely and shown visibly, every view validates its input with a typed error naming the
field, NaN stays NaN, and sizes that would hang a browser are refused."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
import torch

from mi_core.errors import ConfigError
from mi_core.interp import AblationResult, KnockoutSpec
from mi_core.viz import (
    attention_html, attribution_graph_html, comparison_html, feature_activations_html,
    logit_lens_html,
)
from mi_core.viz._page import embed_json
from mi_core.viz._safe import visible

#: what a tokenizer can decode to: a lone surrogate, an RTL override, zero-width and
#: whitespace-only tokens, controls, a no-break space, markup
HOSTILE = ["\udc80", "\u202eevil", "\u200b", "  ", "\x1b[31m", "\xa0", "</script><b>",
           "\u2066x\u2069", "\ufeff", "a\u0301"]


def data_of(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")  # the page is valid UTF-8 whatever the tokens
    m = re.search(r"<script type='application/json' id='mi-data'>(.*?)</script>", text, re.S)
    return json.loads(m.group(1))


def test_hostile_tokens_and_titles_write_a_utf8_page_with_the_tokens_intact(tmp_path):
    pat = torch.softmax(torch.randn(1, len(HOSTILE), len(HOSTILE)), -1)
    out = attention_html(HOSTILE, pat, tmp_path / "a.html", title="lone \udc80 and \u202e",
                         prompt="The \u202ecapital\u202c is\u200b")
    text = out.read_text(encoding="utf-8")
    assert data_of(out)["tokens"] == HOSTILE  # the data round-trip, surrogate included
    # title, subtitle and prompt escaped: no bidi override or invisible character in the markup
    markup = re.sub(r"<script\b.*?</script>", "", text, flags=re.S)
    for c in "\u202e\u202c\u200b\u2066\u2069\ufeff\x1b":
        assert c not in markup
    assert html.escape("The \\u202ecapital\\u202c is\\u200b") in markup
    assert "lone \\udc80 and \\u202e" in markup


def test_visible_escapes_exactly_what_does_not_print_as_python_repr_does():
    for s in HOSTILE + ["plain text", "caf\u00e9", "\u4e2d\u6587", "\U0001f600"]:
        assert visible(s) == repr(s)[1:-1].replace("\\'", "'").replace("\\\\", "\\")
    assert visible("x" * 50, limit=10) == "x" * 9 + "\u2026"


def test_nan_travels_as_nan_and_json_stays_valid():
    text = embed_json({"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "t": "NaN"})
    assert json.loads(text) == {"a": {"__float__": "NaN"}, "b": [{"__float__": "Infinity"},
                                {"__float__": "-Infinity"}, 1.5], "t": "NaN"}  # a token stays


def test_a_feature_with_a_nan_activation_is_kept_first_not_dropped(tmp_path):
    acts = torch.zeros(3, 5)
    acts[0, 1], acts[1, 3], acts[2, 4] = 2.0, float("nan"), 0.5
    out = feature_activations_html(["a", "b", "c"], acts, tmp_path / "f.html")
    assert data_of(out)["labels"] == ["3", "1", "4"]
    assert "1 with NaN activations" in out.read_text(encoding="utf-8")


def test_comparison_with_fewer_logits_than_rows_shows_them_all(tmp_path):
    """A 10-token vocabulary (fewer than the 15 rows asked for) used to be "k out of range"."""
    b, a = torch.randn(10), torch.randn(10)
    rows = data_of(comparison_html(b, a, tmp_path / "c.html"))["rows"]
    assert sorted(r["id"] for r in rows) == list(range(10))
    one = data_of(comparison_html(torch.zeros(1), torch.zeros(1), tmp_path / "one.html"))
    assert [r["id"] for r in one["rows"]] == [0] and one["summary"][0][1] == 0.0


def test_comparison_keeps_nan_logits_visible(tmp_path):
    b = torch.randn(20)
    a = b.clone()
    a[3] = float("nan")
    d = data_of(comparison_html(b, a, tmp_path / "c.html"))
    assert d["summary"][0][1] == {"__float__": "NaN"}  # KL is NaN, shown as NaN


BAD_GRAPHS = [
    ({"nodes": [{"kind": "feature", "layer": 0, "label": "no pos"}]}, "node 0.*pos"),
    ({"nodes": [{"kind": "feature", "pos": 0}]}, "node 0.*layer is missing"),
    ({"nodes": [{"kind": "feature", "layer": 2.5, "pos": 0}]}, "layer must be an integer"),
    ({"nodes": [{"kind": "feature", "layer": 7, "pos": 0}]}, r"layer is 7, outside 0\.\.1"),
    ({"nodes": [{"kind": "token", "pos": "0"}]}, "pos .*must be an integer"),
    ({"nodes": [{"kind": "token", "pos": 0, "activation": "big"}]}, "activation must be a number"),
    ({"nodes": [{"kind": "token", "pos": 0, "influence": 3.0}]}, "influence 3.0 is outside"),
    ({"nodes": [{"kind": "token", "pos": 0, "top_tokens": [("a",)]}]}, r"top_tokens\[0\]"),
    ({"nodes": ["not a mapping"]}, "node 0 must be a mapping"),
    ({"n_layers": 10 ** 8}, r"n_layers is 100000000, outside 1\.\.1024"),
    ({"n_layers": 0}, "n_layers is 0"),
    ({"tokens": []}, "at least one token"),
    ({"tokens": ["a", 3]}, "token 1 is int"),
    ({"src": [0.5], "dst": [0], "weight": [1.0]}, "integer node indices"),
    ({"src": [0], "dst": [5], "weight": [1.0]}, r"edge 0 \(0 -> 5\) names a node outside"),
    ({"nodes": [{"kind": "token", "pos": 0}] * 20_001}, "20,001 nodes are too many"),
    ({"node_threshold": 2.0}, "node_threshold 2.0 is outside"),
]


@pytest.mark.parametrize("change,message", BAD_GRAPHS, ids=[m for _, m in BAD_GRAPHS])
def test_a_malformed_graph_is_a_config_error_naming_the_field(tmp_path, change, message):
    kw = {"tokens": ["a", "b"], "n_layers": 2, "src": [], "dst": [], "weight": [],
          "nodes": [{"kind": "token", "pos": 0}, {"kind": "logit"}]}
    kw.update(change)
    with pytest.raises(ConfigError, match=message):
        attribution_graph_html(tmp_path / "g.html", kw.pop("tokens"), kw.pop("n_layers"),
                               kw.pop("nodes"), kw.pop("src"), kw.pop("dst"), kw.pop("weight"),
                               **kw)
    assert not (tmp_path / "g.html").exists()


def test_a_graph_keeps_nan_weights_and_a_logit_without_pos(tmp_path):
    nodes = [{"kind": "token", "pos": 0}, {"kind": "feature", "layer": 0, "pos": 1,
                                           "activation": float("nan")}, {"kind": "logit"}]
    d = data_of(attribution_graph_html(tmp_path / "g.html", ["a", "b"], 1, nodes, [0, 1],
                                       [1, 2], [float("nan"), 1.0]))
    assert d["nodes"][2]["pos"] == 1 and d["nodes"][1]["activation"] == {"__float__": "NaN"}
    assert len(d["edges"]["src"]) == 2


@pytest.mark.parametrize("call,message", [
    (lambda p: attention_html("abc", torch.ones(1, 3, 3), p), "tokens must be a list"),
    (lambda p: attention_html(["a", None], torch.ones(1, 2, 2), p), "token 1 is NoneType"),
    (lambda p: attention_html(["a"], [[1.0]], p), "pattern must be a tensor"),
    (lambda p: attention_html(["a"] * 2000, torch.zeros(3, 2000, 2000), p),
     "12,000,000 attention weights are too many"),
    (lambda p: attention_html(["a"] * 5000, torch.zeros(1, 1, 1), p),
     "5,000 tokens are too many"),
    (lambda p: comparison_html(torch.zeros(3, 4), torch.zeros(3, 4), p), "one vector"),
    (lambda p: comparison_html(torch.zeros(0), torch.zeros(0), p), "one vector"),
    (lambda p: comparison_html(torch.zeros(4), torch.zeros(4), p, summary=[("x", "y")]),
     "summary 'x' must be a number"),
    (lambda p: comparison_html(torch.zeros(4), torch.zeros(4), p, token_names=lambda i: i),
     "token_names gave int"),
    (lambda p: feature_activations_html(["a"], "acts", p), "acts must be a tensor"),
    (lambda p: feature_activations_html(["a"], torch.ones(1, 2), p, max_features=0),
     "max_features must be at least 1"),
])
def test_every_view_refuses_bad_input_with_a_config_error(tmp_path, call, message):
    with pytest.raises(ConfigError, match=message):
        call(tmp_path / "v.html")


def test_lens_refuses_mismatched_shapes_and_missing_vocabulary(tmp_path):
    from mi_core.interp import LogitLensGrid

    ids = torch.zeros(2, 3, 1, dtype=torch.long)
    g = LogitLensGrid(["L0", "L1"], ["a", "b", "c"], ids, torch.ones(2, 3, 1), [],
                      torch.zeros(2, 3, 0), torch.zeros(2, 3, 0).long(), {0: "x"})
    logit_lens_html(g, tmp_path / "ok.html")
    g.top_probs = torch.ones(2, 2, 1)
    with pytest.raises(ConfigError, match="must both be"):
        logit_lens_html(g, tmp_path / "l.html")
    g.top_probs, g.vocab = torch.ones(2, 3, 1), {}
    with pytest.raises(ConfigError, match=r"token ids \[0\] appear in the lens but not in vocab"):
        logit_lens_html(g, tmp_path / "l.html")


def test_titles_never_show_a_repr_of_a_spec_or_tensor(tmp_path):
    r = AblationResult(torch.randn(12), torch.randn(12), 3, {},
                       KnockoutSpec(layers=[1, 2, 3], from_positions=[-1], to_positions=[0]),
                       "a b c d", prompt_tokens=["a", " b", " c", " d"], model="m.gguf")
    text = r.to_html(tmp_path / "k.html").read_text(encoding="utf-8")
    head = text.split("<script")[0]
    assert "KnockoutSpec(" not in head and "tensor(" not in head
    assert "attention knockout, m.gguf" in head
    assert "layers 1-3, all heads; removed edges query \u2192 key: 3 &#x27; d&#x27; \u2192 " \
           "0 &#x27;a&#x27;" in head
