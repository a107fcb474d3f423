"""The attribution-graph view, for any plugin's graph: nodes placed by layer and position,
edges by weight, pruning sliders, click a node for its inputs, outputs and top tokens.

The core knows no graph class: a plugin's graph (its ``to_html``) passes plain nodes and
edges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from mi_core.plugin import ConfigError
from mi_core.viz._page import f32, prompt_text, write_page

#: node kinds, in the order the page colours them
NODE_KINDS = ("feature", "error", "token", "logit")


def attribution_graph_html(path: str | Path, tokens: Sequence[str], n_layers: int,
                           nodes: Sequence[Mapping[str, Any]], src: Sequence[int] | torch.Tensor,
                           dst: Sequence[int] | torch.Tensor,
                           weight: Sequence[float] | torch.Tensor,
                           *, title: str = "attribution graph", subtitle: str = "",
                           node_threshold: float = 0.8, edge_threshold: float = 0.0,
                           list_k: int = 10, top_tokens_label: str = "top tokens") -> Path:
    """Write the graph page.

    nodes: one mapping per node with ``kind`` (one of NODE_KINDS), ``layer`` (int; ignored
    for tokens and logits), ``pos``, ``label``, and optional ``activation``, ``influence``
    (cumulative influence rank in [0, 1], as circuit-tracer's node pruning: a node is shown
    while influence <= the node slider; None = always shown) and ``top_tokens`` (list of
    (token, score)). Edges: ``src[e] -> dst[e]`` with ``weight[e]`` (direct effect).
    `node_threshold` / `edge_threshold` (fraction of the largest |weight|) set the sliders.
    """
    s, d = torch.as_tensor(src).long().reshape(-1), torch.as_tensor(dst).long().reshape(-1)
    w = torch.as_tensor(weight).float().reshape(-1)
    if not s.shape == d.shape == w.shape:
        raise ConfigError(f"attribution_graph_html: src {list(s.shape)}, dst {list(d.shape)} and "
                          f"weight {list(w.shape)} must have one entry per edge")
    n = len(nodes)
    if len(s) and (int(torch.cat([s, d]).min()) < 0 or int(torch.cat([s, d]).max()) >= n):
        raise ConfigError(f"attribution_graph_html: an edge names a node outside 0..{n - 1}")
    order = w.abs().argsort(descending=True)  # strongest edges drawn last = on top
    s, d, w = s[order].flip(0), d[order].flip(0), w[order].flip(0)
    out = []
    for i, node in enumerate(nodes):
        kind = node.get("kind")
        if kind not in NODE_KINDS:
            raise ConfigError(f"attribution_graph_html: node {i} has kind {kind!r}, "
                              f"expected one of {NODE_KINDS}")
        pos = int(node["pos"])
        if not 0 <= pos < len(tokens):
            raise ConfigError(f"attribution_graph_html: node {i} has position {pos}, outside "
                              f"0..{len(tokens) - 1}")
        act, infl = node.get("activation"), node.get("influence")
        out.append({"kind": NODE_KINDS.index(kind), "layer": int(node.get("layer", 0)), "pos": pos,
                    "label": str(node.get("label", f"node {i}")),
                    "activation": None if act is None else float(act),
                    "influence": None if infl is None else float(infl),
                    "top_tokens": [[str(t), float(v)] for t, v in node.get("top_tokens", ())]})
    data = {"tokens": list(tokens), "n_layers": int(n_layers), "nodes": out,
            "edges": {"src": s.tolist(), "dst": d.tolist(), "weight": f32(w)},
            "node_threshold": float(node_threshold), "edge_threshold": float(edge_threshold),
            "list_k": int(list_k), "top_tokens_label": top_tokens_label}
    return write_page(path, "graph", title, data, subtitle, prompt_text(tokens))
