"""The picture of an attribution graph, from the same plain nodes and edges as the page
(:func:`mi_core.viz.attribution_graph_html`): a row per layer (embeddings at the bottom,
logits on top), a column per position with its token written under the column centre,
features spread inside their cell, logits labelled along the top row, and a legend."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from mi_core.plugin import ConfigError
from mi_core.util.plot._base import _plt, _printable, _shorten, _tok, save_figure

KINDS = ("feature", "error", "token", "logit")
_COLOUR = {"feature": "tab:green", "error": "tab:gray", "token": "black", "logit": "tab:orange"}
_MARKER = {"feature": "o", "error": "s", "token": "s", "logit": "D"}
_WHERE = "plot_attribution_graph"


def _rows(nodes: Sequence[Mapping[str, Any]], n_pos: int, n_layers: int
          ) -> list[tuple[str, int, int]]:
    """(kind, row, pos) per node, checked: row 0 = embeddings, n_layers + 1 = logits."""
    out = []
    for i, n in enumerate(nodes):
        kind = n.get("kind") if isinstance(n, Mapping) else None
        if kind not in KINDS:
            raise ConfigError(f"{_WHERE}: node {i} has kind {kind!r}, expected one of {KINDS}")
        pos = n.get("pos", n_pos - 1 if kind == "logit" else None)
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos < n_pos:
            raise ConfigError(f"{_WHERE}: node {i} has position {pos!r}, expected an int in "
                              f"0..{n_pos - 1}")
        layer = n.get("layer")
        if kind in ("feature", "error") and (isinstance(layer, bool) or not isinstance(layer, int)
                                             or not 0 <= layer < n_layers):
            raise ConfigError(f"{_WHERE}: node {i} has layer {layer!r}, expected an int in "
                              f"0..{n_layers - 1}")
        row = 0 if kind == "token" else n_layers + 1 if kind == "logit" else int(layer) + 1
        out.append((kind, row, pos))
    return out


def _layout(rows: list[tuple[str, int, int]], n_pos: int) -> list[tuple[float, float]]:
    """x, y of every node: the nodes of one cell spread over 80% of the column, in
    sub-rows of 8; logits spread leftwards from the last column along the top row."""
    cells: dict[tuple[int, int], list[int]] = {}
    for i, (_, row, pos) in enumerate(rows):
        cells.setdefault((row, pos), []).append(i)
    xy: list[tuple[float, float]] = [(0.0, 0.0)] * len(rows)
    for (row, pos), members in cells.items():
        if rows[members[0]][0] == "logit":
            step = min(0.9, max(0.35, (n_pos - 0.5) / max(1, len(members))))
            for j, i in enumerate(members):
                xy[i] = (pos + 0.3 - (len(members) - 1 - j) * step, float(row))
            continue
        per, n = 8, len(members)
        for j, i in enumerate(members):
            in_row = min(per, n - (j // per) * per)
            dx = 0.8 / max(per, 1)
            x = pos + ((j % per) - (in_row - 1) / 2) * dx
            y = row + ((j // per) - (((n - 1) // per) / 2)) * 0.16
            xy[i] = (x, y)
    return xy


def plot_attribution_graph(path: str | Path, tokens: Sequence[str], n_layers: int,
                           nodes: Sequence[Mapping[str, Any]], src: Any, dst: Any, weight: Any,
                           *, title: str = "attribution graph", max_edges: int = 400,
                           figsize: tuple[float, float] | None = None) -> Path:
    """Draw the graph (nodes as for :func:`mi_core.viz.attribution_graph_html`; edges
    ``src[e] -> dst[e]`` with ``weight[e]``). The `max_edges` strongest edges are drawn,
    blue positive / red negative, width and opacity ~ |weight|. Token labels sit under
    their column's centre; logit labels are written along the top row at each logit's own
    x; a legend names the node kinds and edge signs."""
    plt = _plt()
    from matplotlib.lines import Line2D

    tokens = [str(t) for t in tokens]
    rows = _rows(nodes, len(tokens), int(n_layers))
    xy = _layout(rows, len(tokens))
    s = torch.as_tensor(src).long().reshape(-1)
    d = torch.as_tensor(dst).long().reshape(-1)
    w = torch.as_tensor(weight, dtype=torch.float32).reshape(-1)
    if not s.shape == d.shape == w.shape:
        raise ConfigError(f"{_WHERE}: src, dst and weight must have one entry per edge")
    if len(s) and (int(torch.cat([s, d]).min()) < 0 or int(torch.cat([s, d]).max()) >= len(rows)):
        raise ConfigError(f"{_WHERE}: an edge names a node outside 0..{len(rows) - 1}")
    n_layers = int(n_layers)
    fig, ax = plt.subplots(figsize=figsize or (max(7.0, 1.15 * len(tokens) + 2.5),
                                               max(4.5, 0.42 * (n_layers + 2) + 2.6)))
    order = w.abs().nan_to_num(nan=0.0).argsort(descending=True)[:max_edges].flip(0)
    wmax = float(w.abs().nan_to_num(nan=0.0).max()) if len(w) else 1.0
    for e in order.tolist():
        a, b, v = int(s[e]), int(d[e]), float(w[e])
        strength = abs(v) / wmax if wmax > 0 and v == v else 0.0
        ax.plot([xy[a][0], xy[b][0]], [xy[a][1], xy[b][1]], lw=0.3 + 2.2 * strength,
                color="tab:blue" if v >= 0 else "tab:red", alpha=0.2 + 0.6 * strength, zorder=1)
    for kind in KINDS:
        pts = [xy[i] for i, r in enumerate(rows) if r[0] == kind]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=26, marker=_MARKER[kind],
                       color=_COLOUR[kind], zorder=3, edgecolors="white", linewidths=0.4)
    for i, (kind, _, _) in enumerate(rows):
        if kind == "logit":
            label = nodes[i].get("label") or ""
            tops = nodes[i].get("top_tokens") or ()
            text = _tok(tops[0][0]) if tops else _printable(label)
            ax.annotate(text, xy[i], xytext=(0, 7), textcoords="offset points", rotation=40,
                        rotation_mode="anchor", ha="left", va="bottom", fontsize=7)
    ax.set_xticks(range(len(tokens)), [f"{_tok(t)}\n{p}" for p, t in enumerate(tokens)],
                  fontsize=7, rotation=0)
    ax.set_xlim(-0.6, len(tokens) - 0.4)
    ax.set_yticks(range(n_layers + 2), ["Emb"] + [f"L{i}" for i in range(n_layers)] + ["Logit"],
                  fontsize=7)
    ax.set_ylim(-0.6, n_layers + 2.2)
    ax.set_xlabel("position: token")
    ax.grid(axis="x", color="#eee", zorder=0)
    handles = [Line2D([], [], marker=_MARKER[k], color=_COLOUR[k], ls="", label=lab)
               for k, lab in (("feature", "feature"), ("error", "error node"),
                              ("token", "token embedding"), ("logit", "logit"))]
    handles += [Line2D([], [], color="tab:blue", lw=2, label="positive edge"),
                Line2D([], [], color="tab:red", lw=2, label="negative edge")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)
    ax.set_title(_shorten(title, max_lines=5), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
