"""The attribution graph result: pruning by influence, graph scores, viewer JSON, a picture.

Node order (as circuit-tracer): [active features (sorted by layer, position, index),
error nodes (layer-major: layer 0 positions 0..n-1, layer 1, ...), token embeddings
(positions 0..n-1), logits (most probable first)]. ``adjacency[target, source]`` is the
direct effect of `source` on `target`; rows of error and token nodes are zero.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import torch

from mi_core.plugin import MIError


@attrs.define(eq=False)
class CircuitGraph:
    """A dense attribution graph for one prompt.

    active_features: [n_features, 3] (layer, position, feature index); activation_values:
    [n_features]; adjacency: [n_nodes, n_nodes] (target, source); logit_probabilities:
    [n_logits]. n_nodes = n_features + n_layers * n_pos + n_pos + n_logits.
    """

    input_tokens: list[int]
    token_strings: list[str]
    n_layers: int
    active_features: torch.Tensor
    activation_values: torch.Tensor
    logit_tokens: list[int]
    logit_strings: list[str]
    logit_probabilities: torch.Tensor
    adjacency: torch.Tensor
    scan: str = ""

    @property
    def n_pos(self) -> int:
        return len(self.input_tokens)

    @property
    def n_features(self) -> int:
        return int(self.active_features.shape[0])

    @property
    def n_logits(self) -> int:
        return len(self.logit_tokens)

    @property
    def error_offset(self) -> int:
        return self.n_features

    @property
    def token_offset(self) -> int:
        return self.n_features + self.n_layers * self.n_pos

    @property
    def logit_offset(self) -> int:
        return self.token_offset + self.n_pos

    def logit_weights(self) -> torch.Tensor:
        w = torch.zeros(self.adjacency.shape[0], dtype=self.adjacency.dtype)
        w[self.logit_offset:] = self.logit_probabilities.to(w.dtype)
        return w

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> "PruneResult":
        """Keep the nodes / edges carrying `node_threshold` / `edge_threshold` of the total
        influence on the logits (circuit-tracer's ``prune_graph``)."""
        return prune_graph(self, node_threshold, edge_threshold)

    def scores(self) -> tuple[float, float]:
        """(replacement score, completeness score) as circuit-tracer's ``compute_graph_scores``."""
        return graph_scores(self)

    def node_kind(self, i: int) -> str:
        if i < self.error_offset:
            return "feature"
        if i < self.token_offset:
            return "error"
        return "token" if i < self.logit_offset else "logit"

    # -- export -------------------------------------------------------------------------
    def to_viewer_json(self, path: str | Path | None = None, slug: str = "graph",
                       node_threshold: float = 0.8, edge_threshold: float = 0.98) -> dict[str, Any]:
        """The pruned graph in circuit-tracer's graph-file schema (what its local viewer and
        Neuronpedia read): ``metadata``, ``qParams``, ``nodes``, ``links``."""
        res = self.prune(node_threshold, edge_threshold)
        nodes = {i: self._node_json(i, float(res.cumulative_scores[i]))
                 for i in res.node_mask.nonzero().flatten().tolist()}
        dst, src = res.edge_mask.nonzero(as_tuple=True)
        links = [{"source": nodes[s]["node_id"], "target": nodes[d]["node_id"],
                  "weight": float(self.adjacency[d, s])}
                 for d, s in zip(dst.tolist(), src.tolist()) if s in nodes and d in nodes]
        used = {x for link in links for x in (link["source"], link["target"])}
        out = {
            "metadata": {"slug": slug, "scan": self.scan or "mi-clt", "transcoder_list": [],
                         "prompt_tokens": self.token_strings, "prompt": "".join(self.token_strings),
                         "node_threshold": node_threshold, "schema_version": 1},
            "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "",
                        "sg_pos": ""},
            "nodes": [n for n in nodes.values()
                      if n["node_id"] in used or n["feature_type"] in ("embedding", "logit")],
            "links": links,
        }
        if path is not None:
            Path(path).write_text(json.dumps(out, indent=2), encoding="utf-8")
        return out

    def _node_json(self, i: int, influence: float) -> dict[str, Any]:
        kind = self.node_kind(i)
        base = {"token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0,
                "clerp": "", "influence": influence, "activation": None}
        if kind == "feature":
            layer, pos, idx = (int(v) for v in self.active_features[i].tolist())
            return {**base, "node_id": f"{layer}_{idx}_{pos}",
                    "feature": (layer + idx) * (layer + idx + 1) // 2 + idx,  # Cantor pairing
                    "layer": str(layer), "ctx_idx": pos, "feature_type": "cross layer transcoder",
                    "jsNodeId": f"{layer}_{idx}-0", "activation": float(self.activation_values[i])}
        if kind == "error":
            layer, pos = divmod(i - self.error_offset, self.n_pos)
            return {**base, "node_id": f"0_{layer}_{pos}", "feature": -1, "layer": str(layer),
                    "ctx_idx": pos, "feature_type": "mlp reconstruction error",
                    "jsNodeId": f"{layer}_{pos}-0"}
        if kind == "token":
            pos = i - self.token_offset
            tok = self.input_tokens[pos]
            return {**base, "node_id": f"E_{tok}_{pos}", "feature": pos, "layer": "E",
                    "ctx_idx": pos, "feature_type": "embedding", "jsNodeId": f"E_{tok}-{pos}"}
        j = i - self.logit_offset
        tok, p, layer = self.logit_tokens[j], float(self.logit_probabilities[j]), str(self.n_layers + 1)
        return {**base, "node_id": f"{layer}_{tok}_{self.n_pos - 1}", "feature": tok, "layer": layer,
                "ctx_idx": self.n_pos - 1, "feature_type": "logit", "token_prob": p,
                "is_target_logit": j == 0, "jsNodeId": f"L_{tok}-{self.n_pos - 1}",
                "clerp": f'Output "{self.logit_strings[j]}" (p={p:.3f})', "influence": None}

    def save_png(self, path: str | Path, node_threshold: float = 0.8,
                 edge_threshold: float = 0.98, max_edges: int = 400) -> Path:
        """A picture of the pruned graph: x = token position (labels under each column),
        y = layer (embeddings at the bottom, logits on top, labelled); edges blue (positive) /
        red (negative), width ~ |weight|; a legend (see :func:`mi_clt.viz.graph_png`)."""
        from mi_clt.viz import graph_png

        return graph_png(self, path, node_threshold, edge_threshold, max_edges)

    def to_html(self, path: str | Path, node_threshold: float = 0.8, edge_threshold: float = 0.0,
                max_edges: int = 5000, model: Any = None, clt: Any = None) -> Path:
        """A self-contained interactive page: nodes by layer and position, pruning sliders,
        click a node for its inputs, outputs and top tokens (see :func:`mi_clt.viz.graph_html`)."""
        from mi_clt.viz import graph_html

        return graph_html(self, path, node_threshold, edge_threshold, max_edges, model, clt)


class PruneResult(NamedTuple):
    node_mask: torch.Tensor  # [n_nodes] bool
    edge_mask: torch.Tensor  # [n_nodes, n_nodes] bool (target, source)
    cumulative_scores: torch.Tensor  # [n_nodes] cumulative influence rank score


def normalize_matrix(a: torch.Tensor) -> torch.Tensor:
    """|a| with each row scaled to sum 1 (rows summing to 0 stay 0)."""
    n = a.abs()
    return n / n.sum(dim=1, keepdim=True).clamp(min=1e-10)


def compute_influence(a: torch.Tensor, logit_weights: torch.Tensor, max_iter: int = 1000
                      ) -> torch.Tensor:
    """w A + w A^2 + ... (the graph is a DAG, so the series terminates)."""
    cur = logit_weights @ a
    total = cur.clone()
    for _ in range(max_iter):
        if not cur.any():
            return total
        cur = cur @ a
        total += cur
    raise MIError(f"influence did not converge in {max_iter} iterations (graph has a cycle?)")


def find_threshold(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    s = scores.sort(descending=True).values
    cum = s.cumsum(0) / s.sum()
    i = min(int(torch.searchsorted(cum, torch.tensor(threshold, dtype=cum.dtype))), len(cum) - 1)
    return s[i]


def prune_graph(g: CircuitGraph, node_threshold: float = 0.8, edge_threshold: float = 0.98
                ) -> PruneResult:
    if not (0.0 <= node_threshold <= 1.0 and 0.0 <= edge_threshold <= 1.0):
        raise MIError(f"thresholds must be in [0, 1], got node={node_threshold}, "
                      f"edge={edge_threshold}")
    a = g.adjacency.float()
    w = g.logit_weights().float()
    n_keep_tail = g.n_logits + g.n_pos
    influence = compute_influence(normalize_matrix(a), w)
    node_mask = influence >= find_threshold(influence, node_threshold)
    node_mask[-n_keep_tail:] = True  # tokens and logits always stay
    pruned = a.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    norm = normalize_matrix(pruned)
    edge_influence = compute_influence(norm, w) + w
    edge_scores = norm * edge_influence[:, None]
    edge_mask = edge_scores >= find_threshold(edge_scores.flatten(), edge_threshold)
    old = node_mask.clone()
    nf = g.n_features
    node_mask[:-n_keep_tail] &= edge_mask[:, :-n_keep_tail].any(0)  # has outgoing edges
    node_mask[:nf] &= edge_mask[:nf].any(1)  # features need incoming edges
    while not torch.equal(node_mask, old):
        old[:] = node_mask
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        node_mask[:-n_keep_tail] &= edge_mask[:, :-n_keep_tail].any(0)
        node_mask[:nf] &= edge_mask[:nf].any(1)
    s, order = influence.sort(descending=True)
    cum = torch.zeros_like(influence)
    cum[order] = s.cumsum(0) / s.sum()
    return PruneResult(node_mask, edge_mask, cum)


def graph_scores(g: CircuitGraph) -> tuple[float, float]:
    """Replacement score: share of token->logit influence that avoids error nodes.
    Completeness: influence-weighted share of node inputs coming from non-error nodes."""
    a = normalize_matrix(g.adjacency.float())
    w = g.logit_weights().float()
    infl = compute_influence(a, w)
    e0, e1, t1 = g.error_offset, g.token_offset, g.logit_offset
    tok, err = infl[e1:t1].sum(), infl[e0:e1].sum()
    replacement = tok / (tok + err)
    non_error = 1 - a[:, e0:e1].sum(-1)
    out_infl = infl + w
    completeness = (non_error * out_infl).sum() / out_infl.sum()
    return float(replacement), float(completeness)


def partial_influences(edge_rows: torch.Tensor, logit_p: torch.Tensor,
                       row_to_node: torch.Tensor, max_iter: int = 128) -> torch.Tensor:
    """Influence of every node on the logits from the rows computed so far (power iteration),
    used to pick which features to expand next when ``max_feature_nodes`` is set."""
    a = edge_rows.abs()
    a = a / a.sum(dim=1, keepdim=True).clamp(min=1e-8)
    infl = torch.zeros(edge_rows.shape[1])
    prod = torch.zeros(edge_rows.shape[1])
    prod[-len(logit_p):] = logit_p
    for _ in range(max_iter):
        prod = prod[row_to_node] @ a
        if not prod.any():
            return infl
        infl += prod
    raise MIError("partial influence computation did not converge")
