"""Page sizes and times in headless Chromium (Debian's chromium + chromedriver): the logit
lens of 30 layers x 128 tokens and the attribution graph of 595 nodes / 5000 edges that the
browser tests use; the page's own render time (MI_RENDER_MS), file:// load to rendered
(wall), and one re-pruning slider step of the graph.

    python bench/bench_views.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.browser import Browser  # noqa: E402
from tests.viz.test_viz_browser import big_lens, synthetic_graph  # noqa: E402


def main() -> None:
    from mi_core.viz import attribution_graph_html

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp())
    nodes, src, dst, w, n_layers, toks = synthetic_graph()
    pages = {"logit lens 30 x 128, top-5": big_lens().to_html(d / "lens.html"),
             "graph 595 nodes, 5000 edges": attribution_graph_html(
                 d / "graph.html", toks, n_layers, nodes, src, dst, w, node_threshold=0.5,
                 edge_threshold=0.1)}
    b = Browser()
    try:
        for name, page in pages.items():
            render, wall = [], []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                render.append(b.open(page))
                wall.append(time.perf_counter() - t0)
            print(f"{name}: {page.stat().st_size / 1024:.0f} KiB, render "
                  f"{statistics.median(render):.0f} ms (min {min(render):.0f}, max "
                  f"{max(render):.0f}), load {statistics.median(wall):.2f} s")
        b.open(pages["graph 595 nodes, 5000 edges"])
        steps = b.js("const s = document.getElementById('edge-threshold'), out = [];"
                     "for (let i = 0; i < 20; i++) { s.value = 0.1 + 0.01 * i;"
                     "const t = performance.now(); s.dispatchEvent(new Event('input'));"
                     "out.push(performance.now() - t); } return out;")
        print(f"graph slider step (re-prune + render): median {statistics.median(steps):.1f} ms")
    finally:
        b.close()


if __name__ == "__main__":
    main()
