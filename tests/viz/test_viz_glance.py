"""What a researcher sees, in headless Chromium at 1400 x 900, on SmolLM2-135M: every view
names what was done (model, prompt, hook, layers, edges as query → key, strength, metric),
keeps its side panel beside the grid / graph and inside the viewport, highlights what is
hovered, keeps headers in view while scrolling, shows tokens as the terminal does and
any Unicode safely; the graph's labels, groups, panel and sliders stay consistent.

The screenshots these tests take are the ones in docs/img: set ``MI_SCREENSHOTS=docs/img``
to write them there (palette PNGs, 1400 x 900); otherwise they go to a temporary folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from mi_core.interp import (
    KnockoutSpec, SteeringSpec, contrastive_steering_vector, detect_heads, dose_response,
    logit_diff_metric, logit_lens_grid, patching_grid, run_knockout,
)
from mi_core.viz import attention_html, attribution_graph_html, feature_activations_html
from mi_core.viz._safe import visible
from tests.viz.conftest import CLT_FIX

PROMPT = "The capital of France is"
#: a token of each kind a tokenizer can produce that a page must show visibly and safely
HOSTILE = ["\udc80", "\u202eevil", "\u200b", "  ", "\x1b[31m", "\xa0", "</script><b>", "it's",
           "say \"hi\"", "back\\slash", "\u2066x\u2069", "\ufeff", "\U0001f600", "", "\n"]


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    out = os.environ.get("MI_SCREENSHOTS")
    path = Path(out) if out else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _features(model, path: Path) -> Path:
    """PCA features of a sentence's own residual stream at layer 6 (feature 2i: + side of
    direction i, 2i+1: - side), as examples/sae_smollm2.py builds its SAE."""
    import mi_core as mi

    text = "The capital of France is Paris, and the capital of Italy is Rome."
    ids = model.to_tokens(text)
    acts = model.forward(ids, mi.HookSpec().capture("blocks.6.hook_resid_post"))[
        "blocks.6.hook_resid_post"][0].float()
    acts = acts[1:]  # the first token's residual is an outlier (norm ~50x) that PCA would fit
    centred = acts - acts.mean(0)
    _, _, v = torch.linalg.svd(centred, full_matrices=False)
    proj = centred @ v[:12].T  # [seq, 12]
    feats = torch.relu(torch.stack([proj, -proj], -1).reshape(len(acts), -1))
    return feature_activations_html(model.to_str_tokens(ids[0])[1:], feats, path,
                                    title="feature activations, SmolLM2-135M-Instruct",
                                    subtitle="24 PCA features of the residual stream after "
                                    "layer 6 (2i: + side of direction i, 2i+1: - side), "
                                    "from the second token on")


def _graph(path: Path) -> Path:
    import json

    import mi_core as mi
    from mi_clt.attribution import attribute
    from safetensors.torch import load_file

    tiny = mi.MIModel.from_pretrained(CLT_FIX / "tiny_llama")
    meta = json.loads((CLT_FIX / "attr_ref.json").read_text())
    clt = mi.load_dictionary(CLT_FIX / meta.get("clt", "attr_clt"))
    ids = load_file(str(CLT_FIX / "attr_ref.safetensors"))["input_tokens"]
    g = attribute(tiny, clt, ids, max_n_logits=meta["max_n_logits"],
                  desired_logit_prob=meta["desired_logit_prob"], batch_size=16)
    from mi_clt.viz import graph_html

    return graph_html(g, path, model=tiny, clt=clt,
                      title="attribution graph, tiny LLaMA + CLT (test fixture)")


@pytest.fixture(scope="module")
def pages(smollm2, tmp_path_factory) -> dict[str, Path]:
    """Each view of one real model, written once for the module."""
    import mi_core as mi

    m, d = smollm2, tmp_path_factory.mktemp("pages")
    paris, rome = (m.tokenizer.encode(t, add_special_tokens=False)[0] for t in (" Paris", " Rome"))
    rep = "The cat sat on the mat. The cat sat on the"
    pat = m.forward(m.to_tokens(rep), mi.HookSpec().capture("blocks.18.attn.hook_pattern"))[
        "blocks.18.attn.hook_pattern"][0]
    v = contrastive_steering_vector(m, ["The capital of Germany is"], [PROMPT], 6, position=3)
    return {
        "attention": attention_html(m.to_str_tokens(m.to_tokens(rep)[0]), pat, d / "a.html",
                                    layer=18, head=6, model_name="SmolLM2-135M-Instruct",
                                    prompt=rep),
        "logit_lens": logit_lens_grid(m, PROMPT, k=5, targets=[" Paris"]).to_html(d / "l.html"),
        "knockout": run_knockout(m, PROMPT, KnockoutSpec(layers=range(10, 20), from_positions=[-1],
                                                      to_positions=[3])).to_html(d / "k.html"),
        "patching": patching_grid(m, PROMPT, "The capital of Italy is",
                                  logit_diff_metric(paris, rome),
                                  layers=range(0, 30, 5)).to_html(d / "p.html"),
        "dose_response": dose_response(m, PROMPT, SteeringSpec.residual([6], v, positions=[3]),
                                       [0.0, 0.25, 0.5, 0.75, 1.0], target=" Berlin"
                                       ).to_html(d / "dose.html"),
        "head_scores": detect_heads(m).to_html(d / "h.html"),
        "features": _features(m, d / "f.html"),
        "attribution_graph": _graph(d / "g.html"),
    }


#: view -> what its one-line description must say
SAYS = {
    "attention": "attention pattern (post-softmax) of layer 18, 9 heads",
    "logit_lens": "tracking ' Paris' (probability and rank, rank 1 = top)",
    "knockout": "layers 10-19, all heads; removed edges query \u2192 key: 4 ' is' \u2192 "
                "3 ' France'; effect = knocked out \u2212 baseline",
    "patching": "metric logit(' Paris') \u2212 logit(' Rome') (logits), normalised: "
                "0 = corrupted, 1 = clean",
    "dose_response": "to blocks.6.hook_resid_pre at position 3 ' France'; effect = steered "
                     "\u2212 baseline",
    "head_scores": "random tokens repeated once",
    "features": "PCA features",
    "attribution_graph": "active features",
}


@pytest.mark.parametrize("view", list(SAYS))
def test_each_view_names_what_was_done_and_keeps_its_panel_beside_it(
        browser, pages, shots, view) -> None:
    browser.open(pages[view])
    assert browser.console_errors() == []
    title = browser.find("#title").text
    what = browser.find("#what").text
    assert title and SAYS[view] in what, (title, what)
    if view not in ("features", "attribution_graph"):
        assert "SmolLM2-135M-Instruct" in title
    body = browser.js("return document.body.innerText")
    assert "Spec(" not in body and "tensor(" not in body  # no repr reaches the page
    side, main = browser.find("#side"), browser.find(".main")
    assert browser.in_viewport(side), f"{view}: the side panel is not in the 1400x900 viewport"
    s_left = browser.js("return arguments[0].getBoundingClientRect().left", side)
    m_right = browser.js("return arguments[0].getBoundingClientRect().right", main)
    assert s_left >= m_right - 1, f"{view}: the panel is not beside the view"
    assert browser.find("#side .panel").text.strip()  # opens with something to read
    assert browser.js("return [innerWidth, innerHeight]") == [1400, 900]
    std, colours = browser.screenshot_stats(shots / f"{view}.png", colours=256)
    assert std > 10 and colours > 30, f"{view} screenshot looks blank"


def test_tokens_show_as_the_terminal_prints_them_and_text_as_python_escapes_it(
        browser, pages) -> None:
    import json

    browser.open(pages["knockout"])
    # as a JS literal: WebDriver's JSON cannot carry a lone surrogate, a JS string can
    got = browser.js(f"return {json.dumps(HOSTILE)}.map((s) => [MI.tok(s), MI.txt(s)])")
    assert [g[0] for g in got] == [repr(s) for s in HOSTILE]
    assert [g[1] for g in got] == [visible(s) for s in HOSTILE]


def test_hostile_tokens_are_visible_in_order_and_inert(browser, tmp_path) -> None:
    toks = ["The", " \u202eevil", " word", "\u200b", "  ", "\udc80",
            "<img src=x onerror=window.X=1>"]
    out = attention_html(toks, torch.softmax(torch.randn(1, 7, 7), -1), tmp_path / "h.html",
                         prompt="".join(toks))
    browser.open(out)
    assert browser.console_errors() == [] and browser.js("return window.X === undefined")
    spans = browser.find_all("#tokens .tok")
    assert [e.text for e in spans] == [repr(t) for t in toks]
    lefts = [browser.js("return arguments[0].getBoundingClientRect().left", e) for e in spans]
    assert lefts == sorted(lefts), "a bidi override reordered the tokens"
    widths = [browser.js("return arguments[0].getBoundingClientRect().width", e) for e in spans]
    assert min(widths) > 12, "an invisible token has no visible width"
    assert "\\u202e" in browser.find("#prompt").text and "\u202e" not in browser.find(
        "#prompt").get_attribute("textContent")


def test_lens_headers_stay_in_view_and_the_hovered_cell_is_marked(browser, tmp_path) -> None:
    from tests.viz.test_viz_browser import big_lens

    browser.open(big_lens().to_html(tmp_path / "lens.html"))
    box = browser.find(".sticky-grid")
    head = browser.find(".col-head")
    browser.js("arguments[0].scrollTop = 300; arguments[0].scrollLeft = 400", box)
    top = browser.js("return [arguments[0].getBoundingClientRect().top, "
                     "arguments[1].getBoundingClientRect().top]", box, head)
    assert abs(top[0] + 1 - top[1]) <= 2, "column headers scrolled away"
    left = browser.js("return [arguments[0].getBoundingClientRect().left, "
                      "arguments[1].getBoundingClientRect().left]", box, browser.find(".row-head"))
    assert abs(left[0] + 1 - left[1]) <= 2, "row labels scrolled away"
    canvas = browser.find("#lens")
    cw, ch = int(canvas.get_attribute("data-cw")), int(canvas.get_attribute("data-ch"))
    browser.hover(canvas, 60 * cw + cw / 2, 20 * ch + ch / 2)
    mark = canvas.get_attribute("data-mark-row"), canvas.get_attribute("data-mark-col")
    assert mark == ("20", "60")
    assert browser.in_viewport(browser.find("#info"))


def test_knockout_table_marks_the_hovered_row_and_keeps_its_header(browser, pages) -> None:
    browser.open(pages["knockout"])
    rows = browser.find_all("#effects tr[data-id]")
    browser.hover(rows[3])
    assert "hover" in rows[3].get_attribute("class")
    assert browser.find("#info").get_attribute("data-id") == rows[3].get_attribute("data-id")
    assert "rank (1 = top)" in browser.find("#info").text
    assert browser.find("#effects th").value_of_css_property("position") == "sticky"


def _edges_consistent(browser, node: int) -> None:
    """Every drawn edge is visible iff pruning keeps it, emphasised iff it touches `node`."""
    state = browser.js("""
      const G = MI_GRAPH, out = [];
      document.querySelectorAll('#edges line').forEach((l) => {
        const e = +l.dataset.e; out.push([e, l.style.display !== 'none', G.edgeOn[e] === 1,
          l.dataset.near === '1', +l.getAttribute('stroke-opacity')]); });
      return out;""")
    ends = browser.js("const D = MI.data(); return [D.edges.src, D.edges.dst]")
    for e, shown, on, near, opacity in state:
        assert shown == on
        if on:
            touches = node in (ends[0][e], ends[1][e])
            assert near == touches and (opacity > 0.9) == touches


def test_graph_labels_panel_groups_and_slider_then_click_stay_consistent(
        browser, pages, tmp_path) -> None:
    browser.open(pages["attribution_graph"])
    labels = browser.find_all("text.pos-label")
    assert [e.text for e in labels] == [repr(t) for t in browser.js("return MI.data().tokens")]
    xs = [browser.js("const b = arguments[0].getBBox(); return b.x + b.width / 2", e)
          for e in labels]
    assert xs == sorted(xs)
    logits = [e.text for e in browser.find_all("g.node text.node-label") if e.text.startswith("'")]
    assert logits, "logit nodes carry their token"
    assert any(e.is_displayed() and e.text.startswith("#")
               for e in browser.find_all("g.node text.node-label")), "no feature id is shown"
    # select a feature, move the edge slider, then click another: edges follow both
    feats = [e for e in browser.find_all("g.node") if e.is_displayed()
             and browser.js("return MI.data().nodes[+arguments[0].dataset.i].kind", e) == 0]
    first = int(feats[0].get_attribute("data-i"))
    browser.click(feats[0].find_element("css selector", ".shape"))
    assert browser.find("#info").get_attribute("data-node") == str(first)
    assert browser.in_viewport(browser.find("#info")) and browser.in_viewport(browser.find("#side"))
    _edges_consistent(browser, first)
    from selenium.webdriver.common.keys import Keys

    browser.find("#edge-threshold").send_keys(*[Keys.ARROW_RIGHT] * 8)
    assert browser.find("#info").get_attribute("data-node") == str(first)
    _edges_consistent(browser, first)
    shown_in = len(browser.find_all("#inputs tr")) - 1
    assert shown_in == min(10, browser.js(
        "const D = MI.data(); let n = 0; D.edges.dst.forEach((d, e) => { if (d === arguments[0] "
        "&& MI_GRAPH.edgeOn[e]) n++; }); return n", first))
    second = next(int(e.get_attribute("data-i")) for e in feats[1:] if e.is_displayed())
    browser.click(browser.find(f'g.node[data-i="{second}"] .shape'))
    assert browser.find("#info").get_attribute("data-node") == str(second)
    _edges_consistent(browser, second)


def test_a_dense_cell_collapses_into_a_counted_group_that_expands(browser, tmp_path) -> None:
    nodes = [{"kind": "token", "pos": p} for p in range(3)]
    nodes += [{"kind": "feature", "layer": 0, "pos": 1, "feature": i, "label": f"f{i}",
               "influence": 0.01 * i} for i in range(30)]
    nodes += [{"kind": "logit", "label": "logit ' x'", "top_tokens": [(" x", 0.5)]}]
    src = [1] * 30 + list(range(3, 33))
    dst = list(range(3, 33)) + [33] * 30
    out = attribution_graph_html(tmp_path / "dense.html", ["a", " b", " c"], 2, nodes, src, dst,
                                 torch.linspace(-1, 1, 60), node_threshold=1.0)
    browser.open(out)
    group = next(g for g in browser.find_all("g.cluster") if g.is_displayed())
    assert group.get_attribute("data-count") == "30" and "30" in group.text
    assert not browser.find('g.node[data-i="5"]').is_displayed()
    browser.click(group)
    assert browser.find('g.node[data-i="5"]').is_displayed() and not group.is_displayed()
    browser.click(browser.find('g.node[data-i="5"] .shape'))
    assert browser.find("#node-title").text == "f2"
    browser.js("document.querySelector('text.collapse[data-cell=\"%s\"]').dispatchEvent("
               "new MouseEvent('click', {bubbles: true}))" % group.get_attribute("data-cell"))
    assert group.is_displayed()


def test_nan_is_shown_as_nan(browser, tmp_path) -> None:
    acts = torch.zeros(3, 4)
    acts[1, 2] = float("nan")
    acts[0, 0] = 1.0
    browser.open(feature_activations_html(["a", "b", "c"], acts, tmp_path / "f.html"))
    first = browser.find("#features .feature")  # feature 2, NaN, listed first
    assert first.text.startswith("2 ") and "NaN" in first.text
    assert browser.console_errors() == []
