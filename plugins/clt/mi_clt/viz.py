"""The interactive page of a :class:`~mi_clt.graph.CircuitGraph`, through the core's generic
graph view (``mi_core.viz.attribution_graph_html``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mi_core.plugin import CltFeatureId, WeightAccess, view


def feature_top_tokens(g: Any, model: Any, clt: Any, k: int = 5
                       ) -> dict[int, list[tuple[str, float]]]:
    """node index -> the `k` tokens each feature's decoder pushes up most directly: the sum
    of its decoder vectors over the layers it writes to, times the unembedding ``W_U``
    (no final norm; a direct-effect reading, as a viewer's "top tokens")."""
    model.require(WeightAccess, "the graph view's top tokens (W_U)")
    w_u = model.backend.get_weight("W_U").detach().float().cpu()  # [d_model, vocab]
    tok = model.tokenizer if model.has_tokenizer else None
    out = {}
    for i in range(g.n_features):
        layer, _, idx = (int(v) for v in g.active_features[i].tolist())
        vec = clt.decoder_vectors(CltFeatureId(layer, idx)).detach().float().cpu().sum(0)
        v, t = (vec @ w_u).topk(k)
        out[i] = [(tok.decode([int(j)]) if tok is not None else str(int(j)), float(s))
                  for s, j in zip(v, t)]
    return out


def graph_nodes(g: Any, keep: list[int], infl: torch.Tensor, fixed: torch.Tensor,
                tops: dict[int, list[tuple[str, float]]]) -> list[dict[str, Any]]:
    """The view's plain nodes (kind, layer, pos, feature, label, activation, influence,
    top_tokens) for the graph's nodes `keep`."""
    nodes = []
    for i in keep:
        kind = g.node_kind(i)
        node: dict[str, Any] = {"kind": kind, "influence": None if fixed[i] else float(infl[i])}
        if kind == "feature":
            layer, pos, idx = (int(v) for v in g.active_features[i].tolist())
            node.update(layer=layer, pos=pos, feature=idx,
                        label=f"L{layer} feature {idx} @{pos} {g.token_strings[pos]!r}",
                        activation=float(g.activation_values[i]), top_tokens=tops.get(i, ()))
        elif kind == "error":
            layer, pos = divmod(i - g.error_offset, g.n_pos)
            node.update(layer=layer, pos=pos,
                        label=f"L{layer} error @{pos} {g.token_strings[pos]!r}")
        elif kind == "token":
            pos = i - g.token_offset
            node.update(layer=-1, pos=pos, label=f"token {g.token_strings[pos]!r} @{pos}")
        else:
            j = i - g.logit_offset
            p = float(g.logit_probabilities[j])
            node.update(layer=g.n_layers, pos=g.n_pos - 1,
                        label=f"logit {g.logit_strings[j]!r} p={p:.3f}",
                        top_tokens=[(g.logit_strings[j], p)])
        nodes.append(node)
    return nodes


def graph_png(g: Any, path: str | Path, node_threshold: float = 0.8,
              edge_threshold: float = 0.98, max_edges: int = 400) -> Path:
    """The pruned graph as a picture (:func:`mi_core.util.plot.plot_attribution_graph`):
    token labels under their columns, logit labels along the top row, a legend."""
    from mi_core.util.plot import plot_attribution_graph

    res = g.prune(node_threshold, edge_threshold)
    keep = res.node_mask.nonzero().flatten().tolist()
    new = {old: j for j, old in enumerate(keep)}
    fixed = torch.zeros(g.adjacency.shape[0], dtype=torch.bool)
    fixed[g.token_offset:] = True
    nodes = graph_nodes(g, keep, res.cumulative_scores, fixed, {})
    dst, src = res.edge_mask.nonzero(as_tuple=True)
    ok = [k for k in range(len(dst)) if int(dst[k]) in new and int(src[k]) in new]
    w = g.adjacency[dst, src].float()[ok] if ok else torch.zeros(0)
    return plot_attribution_graph(
        path, g.token_strings, g.n_layers, nodes, [new[int(src[k])] for k in ok],
        [new[int(dst[k])] for k in ok], w, max_edges=max_edges,
        title=f"attribution graph ({g.scan or 'CLT'}): {len(keep)} nodes, {len(ok)} edges "
              f"(node threshold {node_threshold}, edge threshold {edge_threshold}); edges are "
              "direct effects, blue positive, red negative")


def graph_html(g: Any, path: str | Path, node_threshold: float = 0.8, edge_threshold: float = 0.0,
               max_edges: int = 5000, model: Any = None, clt: Any = None,
               title: str | None = None) -> Path:
    """Write the page: every node within 0.995 cumulative influence, and the `max_edges`
    strongest edges between them; the sliders start at `node_threshold` (cumulative
    influence, as :meth:`CircuitGraph.prune`) and `edge_threshold` (fraction of max |weight|).
    With `model` and `clt`, feature nodes list their top tokens (decoder x W_U)."""
    res = g.prune(node_threshold, 0.98)
    infl = res.cumulative_scores
    n = g.adjacency.shape[0]
    fixed = torch.zeros(n, dtype=torch.bool)
    fixed[g.token_offset:] = True  # token embeddings and logits are always shown
    cand = fixed | (infl <= 0.995)
    adj = g.adjacency.float() * cand[:, None] * cand[None, :]
    dst, src = adj.nonzero(as_tuple=True)
    w = adj[dst, src]
    top = w.abs().argsort(descending=True)[:max_edges]
    dst, src, w = dst[top], src[top], w[top]
    keep = sorted(set(src.tolist()) | set(dst.tolist()) | set(fixed.nonzero().flatten().tolist()))
    new = {old: j for j, old in enumerate(keep)}
    tops = feature_top_tokens(g, model, clt) if model is not None and clt is not None else {}
    nodes = graph_nodes(g, keep, infl, fixed, tops)
    return view("attribution_graph")(
        path, g.token_strings, g.n_layers, nodes, [new[int(s)] for s in src],
        [new[int(d)] for d in dst], w, title=title or "attribution graph",
        subtitle=f"{g.scan or 'CLT'}: {g.n_features} active features, {len(g.logit_tokens)} logits",
        node_threshold=node_threshold, edge_threshold=edge_threshold,
        top_tokens_label="top tokens (decoder x W_U) / logit probability")
