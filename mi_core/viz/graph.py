"""The attribution-graph view, for any plugin's graph: nodes placed by layer and position
(grouped per cell, collapsible), labelled with their feature id, layer, position token and
top tokens; edges by weight; pruning sliders; a side panel for the selected node.

The core knows no graph class: a plugin's graph (its ``to_html``) passes plain nodes and
edges. Every node and edge is validated here, so a malformed graph is a ``ConfigError``
naming the node and field, never a page that throws or hangs the browser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from mi_core.plugin import ConfigError
from mi_core.viz._page import f32, prompt_text, write_page
from mi_core.viz._safe import (
    MAX_GRAPH_EDGES, MAX_GRAPH_NODES, MAX_LAYERS, check_size, check_tokens, integer, number,
)

#: node kinds, in the order the page colours them
NODE_KINDS = ("feature", "error", "token", "logit")
_WHERE = "attribution_graph_html"


def _top_tokens(value: Any, where: str) -> list[list[Any]]:
    if value is None:
        return []
    try:
        pairs = list(value)
    except TypeError:
        raise ConfigError(f"{where}: top_tokens must be a list of (token, score) pairs") from None
    out = []
    for j, pair in enumerate(pairs):
        try:
            t, v = pair
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: top_tokens[{j}] must be a (token, score) pair, got "
                              f"{pair!r:.60}") from None
        if not isinstance(t, str):
            raise ConfigError(f"{where}: top_tokens[{j}] token is {type(t).__name__}, not a "
                              "string")
        out.append([t, number(v, where, f"top_tokens[{j}] score", optional=False)])
    return out


def _node(i: int, node: Any, n_tokens: int, n_layers: int) -> dict[str, Any]:
    """One node checked: kind, layer (features, errors), pos, label, numbers."""
    where = f"{_WHERE}: node {i}"
    if not isinstance(node, Mapping):
        raise ConfigError(f"{where} must be a mapping (kind, layer, pos, label, ...), got "
                          f"{type(node).__name__}")
    kind = node.get("kind")
    if kind not in NODE_KINDS:
        raise ConfigError(f"{where} has kind {kind!r}, expected one of {NODE_KINDS}")
    if kind == "logit" and node.get("pos") is None:
        pos = n_tokens - 1  # a logit predicts the token after the last position
    else:
        pos = integer(node.get("pos"), where, "pos (its token position)")
    if not 0 <= pos < n_tokens:
        raise ConfigError(f"{where} has position {pos}, outside 0..{n_tokens - 1}")
    if kind in ("feature", "error"):
        layer = integer(node.get("layer"), where, "layer", 0, max(0, n_layers - 1))
    else:
        layer = -1 if kind == "token" else n_layers
    infl = number(node.get("influence"), where, "influence")
    if infl is not None and infl == infl and not 0.0 <= infl <= 1.0:
        raise ConfigError(f"{where}: influence {infl} is outside [0, 1] (a cumulative "
                          "influence rank)")
    label = node.get("label")
    if label is not None and not isinstance(label, str):
        raise ConfigError(f"{where}: label must be a string, got {type(label).__name__}")
    feature = node.get("feature")
    if feature is not None and not isinstance(feature, (int, str)):
        raise ConfigError(f"{where}: feature must be an id (int or str), got "
                          f"{type(feature).__name__}")
    return {"kind": NODE_KINDS.index(kind), "layer": layer, "pos": pos,
            "label": label if label is not None else f"{kind} {i}",
            "feature": None if feature is None else str(feature),
            "activation": number(node.get("activation"), where, "activation"),
            "influence": infl, "top_tokens": _top_tokens(node.get("top_tokens"), where)}


def _edges(src: Any, dst: Any, weight: Any, n: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    try:
        s = torch.as_tensor(src).reshape(-1)
        d = torch.as_tensor(dst).reshape(-1)
        w = torch.as_tensor(weight, dtype=torch.float32).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{_WHERE}: src, dst and weight must be number lists ({exc})") from None
    for name, t in (("src", s), ("dst", d)):
        if t.numel() and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
            raise ConfigError(f"{_WHERE}: {name} must hold integer node indices, got {t.dtype}")
    s, d = s.long(), d.long()
    if not s.shape == d.shape == w.shape:
        raise ConfigError(f"{_WHERE}: src {list(s.shape)}, dst {list(d.shape)} and weight "
                          f"{list(w.shape)} must have one entry per edge")
    check_size(len(w), MAX_GRAPH_EDGES, "edges", _WHERE, "prune the graph or pass max_edges")
    if len(s) and (int(torch.cat([s, d]).min()) < 0 or int(torch.cat([s, d]).max()) >= n):
        bad = int(((s < 0) | (s >= n) | (d < 0) | (d >= n)).nonzero()[0])
        raise ConfigError(f"{_WHERE}: edge {bad} ({int(s[bad])} -> {int(d[bad])}) names a node "
                          f"outside 0..{n - 1}")
    return s, d, w


def attribution_graph_html(path: str | Path, tokens: Sequence[str], n_layers: int,
                           nodes: Sequence[Mapping[str, Any]], src: Sequence[int] | torch.Tensor,
                           dst: Sequence[int] | torch.Tensor,
                           weight: Sequence[float] | torch.Tensor,
                           *, title: str = "attribution graph", subtitle: str = "",
                           node_threshold: float = 0.8, edge_threshold: float = 0.0,
                           list_k: int = 10, top_tokens_label: str = "top tokens") -> Path:
    """Write the graph page.

    nodes: one mapping per node with ``kind`` (one of NODE_KINDS), ``layer`` (int, required
    for features and error nodes), ``pos`` (required, except for logits: the last
    position), ``label``, and optional ``feature`` (its id, shown on the node),
    ``activation``, ``influence`` (cumulative influence rank in [0, 1], as circuit-tracer's
    node pruning: a node is shown while influence <= the node slider; None = always shown)
    and ``top_tokens`` (list of (token, score)). Edges: ``src[e] -> dst[e]`` with
    ``weight[e]`` (direct effect). `node_threshold` / `edge_threshold` (fraction of the
    largest |weight|) set the sliders. NaN activations and weights are kept and shown as
    NaN; a graph larger than a browser can draw is refused.
    """
    tokens = check_tokens(tokens, _WHERE, limit=2048)
    if not tokens:
        raise ConfigError(f"{_WHERE}: a graph needs at least one token")
    n_layers = integer(n_layers, _WHERE, "n_layers", 1, MAX_LAYERS)
    if isinstance(nodes, (str, bytes, Mapping)) or not isinstance(nodes, Sequence):
        raise ConfigError(f"{_WHERE}: nodes must be a list of mappings")
    check_size(len(nodes), MAX_GRAPH_NODES, "nodes", _WHERE, "prune the graph first")
    out = [_node(i, node, len(tokens), n_layers) for i, node in enumerate(nodes)]
    s, d, w = _edges(src, dst, weight, len(out))
    for name, v, hi in (("node_threshold", node_threshold, 1.0),
                        ("edge_threshold", edge_threshold, 1.0)):
        x = number(v, _WHERE, name, optional=False)
        if not 0.0 <= x <= hi:
            raise ConfigError(f"{_WHERE}: {name} {x} is outside [0, 1]")
    order = w.abs().nan_to_num(nan=-1.0).argsort(descending=True)  # strongest drawn last
    s, d, w = s[order].flip(0), d[order].flip(0), w[order].flip(0)
    data = {"tokens": tokens, "n_layers": n_layers, "nodes": out,
            "edges": {"src": s.tolist(), "dst": d.tolist(), "weight": f32(w)},
            "node_threshold": float(node_threshold), "edge_threshold": float(edge_threshold),
            "list_k": int(list_k), "top_tokens_label": str(top_tokens_label)}
    counts = [sum(1 for n in out if n["kind"] == k) for k in range(4)]
    sub = subtitle or (f"{counts[0]} features, {counts[1]} error nodes, {counts[2]} tokens, "
                       f"{counts[3]} logits, {len(w)} edges (direct effects)")
    return write_page(path, "graph", title, data, sub, prompt_text(tokens))
