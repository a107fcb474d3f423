"""Every interactive view in a real browser (headless Chromium through selenium): the page
loads from file:// with no console error, the interactions (hover, click, sliders, sorting)
show values equal to the data the page was written from, large data render and respond
within the stated bound, and screenshots are not blank.

Values on a page are printed with 4 decimals (MI.fmt), so they are compared to the data
with an absolute tolerance of 5e-5 (half the last printed digit); values the page keeps in
data attributes are float32 and compared at 1e-6.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from mi_core.interp import (
    KnockoutSpec, LogitLensGrid, SteeringSpec, dose_response, logit_diff_metric, patching_grid,
    run_knockout,
)
from mi_core.interp._common import resolve_token
from mi_core.viz import attention_html, attribution_graph_html, feature_activations_html
from tests.viz.conftest import shown

#: page load (navigation + render) and one interaction must each finish within this
BOUND_S = 2.0
PROMPT = "w3 w17 w5 w9 w21 w4"


def cells(table) -> list[list[str]]:
    """The text of each data row of a <table> element (header row dropped)."""
    return [[td.text for td in tr.find_elements("css selector", "td")]
            for tr in table.find_elements("css selector", "tr")][1:]


def opened(browser, path: Path) -> float:
    """Load `path`; assert no console error; return the wall time in seconds."""
    t = time.perf_counter()
    browser.open(path)
    wall = time.perf_counter() - t
    assert browser.console_errors() == []
    return wall


def not_blank(browser, path: Path) -> None:
    std, colours = browser.screenshot_stats(path)
    assert std > 10 and colours > 50, f"screenshot {path} looks blank (std {std:.1f}, {colours} colours)"


def test_attention_hover_token_and_head_show_the_pattern(browser, tiny, tmp_path: Path) -> None:
    import mi_core as mi

    ids = tiny.to_tokens(PROMPT)
    toks = tiny.to_str_tokens(ids[0])
    pat = tiny.forward(ids, mi.HookSpec().capture("blocks.1.attn.hook_pattern"))[
        "blocks.1.attn.hook_pattern"][0].float()  # [heads, q, k]
    out = attention_html(toks, pat, tmp_path / "attention.html", layer=1)
    opened(browser, out)
    q = 3
    browser.hover(browser.find(f'#tokens .tok[data-i="{q}"]'))
    mean = pat.mean(0)[q]
    rows = cells(browser.find("#info table"))
    order = mean.argsort(descending=True)[: len(rows)].tolist()
    assert [int(r[0]) for r in rows] == order
    assert [r[1] for r in rows] == [shown(toks[k]) for k in order]
    for r, k in zip(rows, order):
        assert float(r[2]) == pytest.approx(float(mean[k]), abs=5e-5)
    # select head 2, hover the same query: the token colours carry that head's row
    browser.click(browser.find('button[data-head="2"]'))
    browser.hover(browser.find(f'#tokens .tok[data-i="{q}"]'))
    weights = [float(s.get_attribute("data-weight")) for s in browser.find_all("#tokens .tok")]
    torch.testing.assert_close(torch.tensor(weights), pat[2, q], atol=1e-6, rtol=0)
    assert browser.find("#info").get_attribute("data-head") == "2"
    # select head 0 and hover one cell of its large grid: query 4 -> key 1
    browser.click(browser.find('button[data-head="0"]'))
    canvas = browser.find("#pattern")
    size = int(canvas.get_attribute("data-cw"))
    browser.hover(canvas, 1 * size + size / 2, 4 * size + size / 2)
    cell = browser.find("#cell")
    assert (cell.get_attribute("data-query"), cell.get_attribute("data-key")) == ("4", "1")
    assert float(cell.get_attribute("data-value")) == pytest.approx(float(pat[0, 4, 1]), abs=1e-6)
    assert canvas.get_attribute("data-mark-row") == "4"  # the hovered cell is outlined
    assert browser.console_errors() == []
    not_blank(browser, tmp_path / "attention.png")


def test_markup_tokens_stay_text_in_the_browser(browser, tmp_path: Path) -> None:
    toks = ["<s>", "</script><script>window.PWNED=1</script>", '"&amp;', "<img src=x onerror=window.PWNED=2>", "\n"]
    out = attention_html(toks, torch.softmax(torch.randn(2, 5, 5), -1), tmp_path / "nasty.html")
    opened(browser, out)
    assert browser.js("return window.PWNED === undefined")
    assert browser.js("return document.scripts.length") == 2
    assert browser.js("return document.images.length") == 0
    texts = browser.js("return [...document.querySelectorAll('#tokens .tok')].map(e => e.textContent)")
    assert texts == [shown(t) for t in toks]
    # the prompt line shows the text with its invisible characters escaped
    assert browser.js("return document.querySelector('.prompt').textContent") == \
        "".join(toks).replace("\n", "\\n")


def big_lens(points: int = 30, seq: int = 128, k: int = 5) -> LogitLensGrid:
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(points, seq, 1000, generator=g) * 3, -1)
    top_p, top_i = probs.topk(k, -1)
    vocab = {i: f"tok{i}" for i in range(1000)}
    vocab[7], vocab[8] = "<b>bold</b>", " "
    return LogitLensGrid([f"L{i}" for i in range(points)], [f" w{i}" for i in range(seq)], top_i,
                         top_p, [7], probs[:, :, [7]], (probs > probs[:, :, [7]]).sum(-1, keepdim=True),
                         vocab)


def test_logit_lens_30_layers_x_128_tokens_loads_and_answers_hover_fast(browser, tmp_path: Path) -> None:
    grid = big_lens()
    out = grid.to_html(tmp_path / "lens.html")
    wall = opened(browser, out)
    assert wall < BOUND_S, f"page load took {wall:.2f} s"
    canvas = browser.find("#lens")
    cw, ch = int(canvas.get_attribute("data-cw")), int(canvas.get_attribute("data-ch"))
    for r, c in [(0, 0), (17, 64), (29, 127)]:
        t = time.perf_counter()
        browser.hover(canvas, c * cw + cw / 2, r * ch + ch / 2)
        info = browser.find("#info")
        assert info.get_attribute("data-row") == str(r) and info.get_attribute("data-col") == str(c)
        rows = cells(browser.find("#info table"))
        assert time.perf_counter() - t < BOUND_S
        assert [row[1] for row in rows] == [shown(grid.vocab[int(i)]) for i in grid.top_ids[r, c]]
        for row, p in zip(rows, grid.top_probs[r, c]):
            assert float(row[2]) == pytest.approx(float(p), abs=5e-5)
        target = cells(browser.find_all("#info table")[1])[0]
        assert target[0] == shown("<b>bold</b>")
        assert float(target[1]) == pytest.approx(float(grid.target_probs[r, c, 0]), abs=5e-5)
        assert int(target[2]) == int(grid.target_ranks[r, c, 0]) + 1
    assert browser.console_errors() == []
    not_blank(browser, tmp_path / "lens.png")


def test_logit_lens_of_a_real_model(browser, tiny, tmp_path: Path) -> None:
    from mi_core.interp import logit_lens_grid

    grid = logit_lens_grid(tiny, PROMPT, k=3)
    opened(browser, grid.to_html(tmp_path / "lens_tiny.html"))
    canvas = browser.find("#lens")
    cw, ch = int(canvas.get_attribute("data-cw")), int(canvas.get_attribute("data-ch"))
    browser.hover(canvas, 2 * cw + 3, 1 * ch + 3)
    rows = cells(browser.find("#info table"))
    assert [r[1] for r in rows] == [shown(grid.vocab[int(i)]) for i in grid.top_ids[1, 2]]
    assert float(rows[0][2]) == pytest.approx(float(grid.top_probs[1, 2, 0]), abs=5e-5)


def test_patching_grid_hover_shows_the_cell(browser, tiny, tmp_path: Path) -> None:
    metric = logit_diff_metric(resolve_token(tiny, "w5"), resolve_token(tiny, "w9"))
    r = patching_grid(tiny, PROMPT, "w3 w17 w9 w9 w21 w4", metric)
    opened(browser, r.to_html(tmp_path / "patch.html"))
    canvas = browser.find("#grid")
    cw, ch = int(canvas.get_attribute("data-cw")), int(canvas.get_attribute("data-ch"))
    for row, col in [(0, 2), (2, 5)]:
        browser.hover(canvas, col * cw + cw / 2, row * ch + ch / 2)
        info = browser.find("#info")
        assert float(info.get_attribute("data-value")) == pytest.approx(float(r.grid[row, col]), abs=1e-6)
        norm, patched, effect = (float(row[1]) for row in cells(browser.find("#info table")))
        assert norm == pytest.approx(float(r.grid[row, col]), abs=5e-5)
        assert effect == pytest.approx(float(r.effect()[row, col]), abs=5e-4)
    not_blank(browser, tmp_path / "patch.png")


def test_knockout_table_hover_and_sort_show_the_effects(browser, tiny, tmp_path: Path) -> None:
    ids = tiny.to_tokens(PROMPT)
    r = run_knockout(tiny, ids, KnockoutSpec(from_positions=[-1], to_positions=[1, 2, 3]))
    opened(browser, r.to_html(tmp_path / "knockout.html"))
    # reference: softmax of the raw logits, here in float64
    p0 = torch.softmax(r.baseline_logits.double(), -1)
    p1 = torch.softmax(r.ablated_logits.double(), -1)
    kl = float((p0 * (p0.log() - p1.log())).sum())
    assert float(cells(browser.find("#summary table"))[0][1]) == pytest.approx(kl, abs=5e-6)
    rows = browser.find_all("#effects tr[data-id]")
    d = [float(tr.find_elements("css selector", "td")[3].text) for tr in rows]
    assert d == sorted(d), "default order: most lowered first"
    tr = rows[0]
    tid = int(tr.get_attribute("data-id"))
    browser.hover(tr)
    body = cells(browser.find("#info table"))
    assert float(body[0][1]) == pytest.approx(float(p0[tid]), abs=5e-5)
    assert float(body[0][2]) == pytest.approx(float(p1[tid]), abs=5e-5)
    assert float(body[0][3]) == pytest.approx(float(p1[tid] - p0[tid]), abs=5e-5)
    assert float(body[1][3]) == pytest.approx(float(p1[tid].log() - p0[tid].log()), abs=5e-5)
    assert float(body[2][3]) == pytest.approx(float(r.ablated_logits[tid] - r.baseline_logits[tid]), abs=5e-5)
    # click the "p baseline" header: sorted by baseline probability, largest first
    browser.click(browser.find('#effects th[data-col="1"]'))
    pb = [float(tr.find_elements("css selector", "td")[1].text) for tr in browser.find_all("#effects tr[data-id]")]
    assert pb == sorted(pb, reverse=True)
    assert browser.console_errors() == []
    not_blank(browser, tmp_path / "knockout.png")


def test_steering_page_shows_kl_attention_and_named_tokens(browser, tiny, tmp_path: Path) -> None:
    from mi_core.interp import apply_steering

    r = apply_steering(tiny, PROMPT, SteeringSpec.attention([1, 2], [1], [-1], scale=4.0))
    out = r.to_html(tmp_path / "steer.html", token_names=lambda i: tiny.to_string([i]))
    opened(browser, out)
    summary = dict(cells(browser.find("#summary table")))
    assert float(summary["KL(baseline || steered) (nats)"]) == pytest.approx(r.kl_divergence(), abs=5e-5)
    assert float(summary["attention to the steered keys, steered"]) == pytest.approx(
        r.steered_attention, abs=5e-5)
    first = browser.find("#effects tr[data-id]")
    tid = int(first.get_attribute("data-id"))
    assert first.find_element("css selector", "td").text == shown(tiny.to_string([tid]))
    browser.hover(first)
    assert float(cells(browser.find("#info table"))[0][3]) == pytest.approx(r.prob_diff(tid), abs=5e-5)


def test_dose_response_hover_shows_each_point(browser, tiny, tmp_path: Path) -> None:
    ids = tiny.to_tokens(PROMPT)
    curve = dose_response(tiny, ids, SteeringSpec.attention([1, 2], [1], [-1]), [0.0, 1.0, 3.0],
                          target="w5")
    opened(browser, curve.to_html(tmp_path / "dose.html"))
    for i, p in enumerate(curve.points):
        browser.hover(browser.find(f'circle.pt[data-i="{i}"]'))
        vals = dict((r[0], r[1]) for r in cells(browser.find("#info table")))
        assert float(vals["strength s"]) == pytest.approx(p.strength, abs=5e-4)
        assert float(vals["KL(baseline || steered), nats"]) == pytest.approx(p.kl_divergence,
                                                                             abs=5e-6)
        assert float(vals["p('w5')"]) == pytest.approx(p.target_prob, abs=5e-5)
    not_blank(browser, tmp_path / "dose.png")


def synthetic_graph(n_layers: int = 12, seq: int = 16, per_cell: int = 3, n_edges: int = 5000):
    """A random DAG: features at (layer, pos), tokens, 3 logits; edges go upwards."""
    g = torch.Generator().manual_seed(1)
    nodes = [{"kind": "token", "layer": -1, "pos": p, "label": f"tok {p}"} for p in range(seq)]
    for layer in range(n_layers):
        for p in range(seq):
            for j in range(per_cell):
                nodes.append({"kind": "feature", "layer": layer, "pos": p,
                              "label": f"L{layer} f{j} @{p}", "activation": float(torch.rand(1, generator=g)),
                              "influence": float(torch.rand(1, generator=g)),
                              "top_tokens": [(f"t{j}", 1.5), ("<i>", 0.5)]})
    nodes += [{"kind": "logit", "layer": n_layers, "pos": seq - 1, "label": f"logit {j}"} for j in range(3)]
    row = torch.tensor([-1 if n["kind"] == "token" else n_layers if n["kind"] == "logit" else n["layer"]
                        for n in nodes])
    src = torch.randint(len(nodes), (n_edges * 3,), generator=g)
    dst = torch.randint(len(nodes), (n_edges * 3,), generator=g)
    ok = row[src] < row[dst]
    pairs = sorted(set(zip(src[ok].tolist(), dst[ok].tolist())))[:n_edges]
    src, dst = torch.tensor([a for a, _ in pairs]), torch.tensor([b for _, b in pairs])
    w = torch.randn(len(pairs), generator=g)
    return nodes, src, dst, w, n_layers, [f" w{p}" for p in range(seq)]


def expected_counts(nodes, src, dst, w, node_t: float, edge_frac: float) -> tuple[int, int]:
    on = torch.tensor([n["kind"] in ("token", "logit") or n["influence"] <= node_t + 1e-9 for n in nodes])
    w32 = w.float()
    e = on[src] & on[dst] & (w32.abs() >= edge_frac * w32.abs().max())
    return int(on.sum()), int(e.sum())


def test_attribution_graph_of_thousands_of_edges_prunes_and_clicks(browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.keys import Keys

    nodes, src, dst, w, n_layers, toks = synthetic_graph()
    assert len(w) == 5000
    out = attribution_graph_html(tmp_path / "graph.html", toks, n_layers, nodes, src, dst, w,
                                 node_threshold=0.5, edge_threshold=0.1)
    wall = opened(browser, out)
    assert wall < BOUND_S, f"page load took {wall:.2f} s"
    counts = browser.find("#counts")

    def shown_counts() -> tuple[int, int]:
        return int(counts.get_attribute("data-nodes")), int(counts.get_attribute("data-edges"))

    assert shown_counts() == expected_counts(nodes, src, dst, w, 0.5, 0.1)
    # the sliders, driven from the keyboard: node threshold 0.5 -> 0.8, edge 0.1 -> 0.05
    slider = browser.find("#node-threshold")
    t = time.perf_counter()
    slider.send_keys(*[Keys.ARROW_RIGHT] * 30)
    assert time.perf_counter() - t < BOUND_S * 2  # 30 re-prunings of 5000 edges
    assert float(slider.get_attribute("value")) == pytest.approx(0.8)
    browser.find("#edge-threshold").send_keys(*[Keys.ARROW_LEFT] * 10)
    assert shown_counts() == expected_counts(nodes, src, dst, w, 0.8, 0.05)
    # click a feature node: its inputs / outputs / top tokens equal the data
    i = next(j for j, n in enumerate(nodes) if n["kind"] == "feature" and n["layer"] == 5
             and n["influence"] <= 0.8)
    circle = browser.find(f'g.node[data-i="{i}"]')
    t = time.perf_counter()
    browser.click(circle)
    assert browser.find("#info").get_attribute("data-node") == str(i)
    assert time.perf_counter() - t < BOUND_S
    on = torch.tensor([n["kind"] in ("token", "logit") or n["influence"] <= 0.8 + 1e-9 for n in nodes])
    vis = on[src] & on[dst] & (w.abs() >= 0.05 * w.abs().max())
    inc = [(int(s), float(x)) for s, d, x, v in zip(src, dst, w, vis) if int(d) == i and v]
    inc.sort(key=lambda e: -abs(e[1]))
    rows = cells(browser.find("#inputs"))
    assert [r[0] for r in rows] == [nodes[s]["label"] for s, _ in inc[:10]]
    for r, (_, x) in zip(rows, inc):
        assert float(r[1]) == pytest.approx(x, abs=5e-5)
    outg = sorted([(int(d), float(x)) for s, d, x, v in zip(src, dst, w, vis) if int(s) == i and v],
                  key=lambda e: -abs(e[1]))
    assert [r[0] for r in cells(browser.find("#outputs"))] == [nodes[d]["label"] for d, _ in outg[:10]]
    assert cells(browser.find("#top-tokens")) == [
        [repr("t" + nodes[i]["label"].split()[1][1:]), "1.5000"], [repr("<i>"), "0.5000"]]
    assert browser.console_errors() == []
    not_blank(browser, tmp_path / "graph.png")


def test_circuit_graph_page_lists_feature_top_tokens(browser, tiny, tmp_path: Path) -> None:
    import json

    import mi_core as mi
    from mi_clt.attribution import attribute
    from safetensors.torch import load_file

    from tests.viz.conftest import CLT_FIX

    meta = json.loads((CLT_FIX / "attr_ref.json").read_text())
    clt = mi.load_dictionary(CLT_FIX / meta.get("clt", "attr_clt"))
    ids = load_file(str(CLT_FIX / "attr_ref.safetensors"))["input_tokens"]
    g = attribute(tiny, clt, ids, max_n_logits=meta["max_n_logits"],
                  desired_logit_prob=meta["desired_logit_prob"], batch_size=16)
    opened(browser, g.to_html(tmp_path / "circuit.html", model=tiny, clt=clt))
    feature = next(c for c in browser.find_all("g.node")
                   if c.is_displayed() and c.find_element("css selector", "title").get_attribute(
                       "textContent").startswith("L1 feature"))
    browser.click(feature)
    label = browser.find("#node-title").text  # "L1 feature IDX @POS 'TOKEN'"
    layer, idx, pos = 1, int(label.split()[2]), int(label.split("@")[1].split()[0])
    # reference: the decoder vector at each target layer, summed, times W_U
    f = mi.CltFeatureId(layer, idx)
    vec = sum(clt.decoder_vector(f, t).float() for t in range(layer, clt.n_layers))
    scores = vec @ tiny.backend.get_weight("W_U").float()
    top = scores.topk(5)
    rows = cells(browser.find("#top-tokens"))
    assert [r[0] for r in rows] == [shown(tiny.to_string([int(t)])) for t in top.indices]
    for r, s in zip(rows, top.values):
        assert float(r[1]) == pytest.approx(float(s), abs=5e-5)
    assert any(n["ctx_idx"] == pos for n in g.to_viewer_json(node_threshold=1.0)["nodes"])
    not_blank(browser, tmp_path / "circuit.png")


def test_feature_activations_click_and_hover(browser, tmp_path: Path) -> None:
    toks = ["<s>", " The", "<script>", '"&', " cat"]
    g = torch.Generator().manual_seed(2)
    acts = torch.relu(torch.randn(5, 40, generator=g)) * (torch.rand(5, 40, generator=g) < 0.3)
    out = feature_activations_html(toks, acts, tmp_path / "features.html")
    opened(browser, out)
    # the page keeps the active features, largest activation first; pick the 4th
    order = [int(x) for x in acts.amax(0).argsort(descending=True) if acts[:, x].any()]
    f = order[3]
    browser.click(browser.find('#features .feature[data-f="3"]'))
    assert browser.find("#selected").text.startswith(f"feature {f} ")
    got = [float(s.get_attribute("data-act")) for s in browser.find_all("#tokens .tok")]
    torch.testing.assert_close(torch.tensor(got), acts[:, f], atol=1e-6, rtol=0)
    assert [s.text for s in browser.find_all("#tokens .tok")] == [shown(t) for t in toks]
    browser.hover(browser.find('#tokens .tok[data-s="2"]'))
    rows = cells(browser.find("#info table"))
    active = [int(x) for x in acts[2].argsort(descending=True) if acts[2, x] > 0][:10]
    assert [int(r[0]) for r in rows] == active
    assert browser.console_errors() == []
    not_blank(browser, tmp_path / "features.png")


@pytest.mark.parametrize("argv, element", [
    (["attention", "--layer", "1", "--head", "2"], "canvas.head"),
    (["logit-lens", "--mid", "--target", "w5"], "#lens"),
    (["knockout", "--layers", "0-2"], "#effects"),
    (["patch", "--corrupt", "w3 w17 w9 w9 w21 w4", "--correct", "w5", "--incorrect", "w9"], "#grid"),
    (["steer", "--target", "w5", "--strengths", "0,1,2"], "#chart"),
])
def test_cli_plot_html_writes_the_interactive_page(browser, argv, element, tmp_path: Path) -> None:
    from mi_cli.main import main

    from tests.viz.conftest import CLT_FIX

    out = tmp_path / f"{argv[0]}.html"
    rc = main(argv + ["--model", str(CLT_FIX / "tiny_llama"), "--prompt", PROMPT, "--plot", str(out)])
    assert rc == 0 and out.exists()
    opened(browser, out)
    assert browser.find(element).is_displayed()
    assert browser.js("return document.querySelector('.prompt').textContent") == PROMPT
