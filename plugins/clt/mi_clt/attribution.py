"""Attribution: decoder-projection scoring (the seed's) and full attribution graphs.

`attribute` builds the graph circuit-tracer builds: in the *local replacement model* the
attention patterns and every norm's scale are frozen (detached), each MLP output is replaced
by the CLT's reconstruction plus an error node (a detached leaf whose value is the real MLP
output), so every path from a source node to a target node is linear. The direct effect of
source s on target t is then one gradient contraction: inject t's input vector (its encoder
row at its input hook, or the de-meaned unembedding column of a logit through the final
norm's gain, at ``ln_final.hook_normalized``) as the gradient, and read ``grad(mlp_out[l]) . (a_s W_dec[s -> l])`` for features,
``grad(mlp_out[l]) . error[l]`` for error nodes and ``grad(embed) . embedding`` for tokens.
Many targets share one batched forward (one row per batch element) and one backward pass.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import torch

from mi_core.plugin import (
    CltFeatureId, DictionaryError, HookSpec, MIError, Readout, WeightAccess, Progress,
)

from mi_clt.clt import CrossLayerTranscoder
from mi_clt.graph import CircuitGraph, partial_influences


# -- the seed's decoder-projection attribution ------------------------------------------
@attrs.define
class AttributionEdge:
    """A feature's (decoder-projection) score toward a named target direction."""

    source: CltFeatureId
    target: str
    score: float


@attrs.define
class AttributionGraph:
    """Edges from CLT features to one target, strongest (largest score) first."""

    target: str
    edges: list[AttributionEdge] = attrs.field(factory=list)

    def top_k(self, k: int) -> "AttributionGraph":
        return AttributionGraph(self.target, sorted(self.edges, key=lambda e: -e.score)[:k])

    def threshold(self, min_abs_score: float) -> "AttributionGraph":
        return AttributionGraph(self.target, [e for e in self.edges
                                              if abs(e.score) >= min_abs_score])

    def features(self) -> list[CltFeatureId]:
        return [e.source for e in self.edges]

    def __len__(self) -> int:
        return len(self.edges)


def extract_decoder_vectors(clt: CrossLayerTranscoder, features: Sequence[CltFeatureId],
                            target_layer: int) -> torch.Tensor:
    """Each feature's decoder vector [n, d_model] at `target_layer` (reads only those rows)."""
    return torch.stack([clt.decoder_vector(f, target_layer) for f in features]) if features \
        else torch.zeros(0, clt.d_model, dtype=clt.dtype, device=clt.device)


def score_features_by_decoder_projection(
        clt: CrossLayerTranscoder, direction: torch.Tensor, target_layer: int,
        top_k: int | None = None, cosine: bool = False, target: str = "direction",
        chunk: int = 4096) -> AttributionGraph:
    """Score every feature that writes to `target_layer` by ``W_dec[f -> target_layer] .
    direction`` (cosine similarity when `cosine`); direction [d_model] (e.g. an unembedding
    column). Source layers are streamed in chunks of `chunk` rows, one layer at a time."""
    if direction.shape != (clt.d_model,):
        raise DictionaryError(f"direction must be [d_model={clt.d_model}], got {list(direction.shape)}")
    d = direction.to(clt.dtype).to(clt.device)
    if cosine:
        d = d / d.norm().clamp_min(1e-12)
    edges: list[AttributionEdge] = []
    for src in range(clt.n_layers):
        t = clt.target_layers(src)
        if target_layer not in t:
            continue
        for start in range(0, clt.d_features, chunk):
            idx = torch.arange(start, min(start + chunk, clt.d_features), device="cpu")
            rows = clt.decoder_rows(src, idx)[:, target_layer - t.start]  # [n, d_model]
            s = rows @ d
            if cosine:
                s = s / rows.norm(dim=-1).clamp_min(1e-12)
            if top_k is not None:  # keep the candidate list short while streaming
                vals, pos = s.topk(min(top_k, len(s)))
                edges += [AttributionEdge(CltFeatureId(src, int(idx[p])), target, float(v))
                          for v, p in zip(vals.tolist(), pos.tolist())]
            else:
                edges += [AttributionEdge(CltFeatureId(src, int(i)), target, float(v))
                          for i, v in zip(idx.tolist(), s.tolist())]
    g = AttributionGraph(target, sorted(edges, key=lambda e: -e.score))
    return g.top_k(top_k) if top_k is not None else g


def build_attribution_graph(clt: CrossLayerTranscoder, direction: torch.Tensor,
                            target_layer: int, target: str = "direction", top_k: int = 20,
                            cosine: bool = True) -> AttributionGraph:
    """The seed's convenience: the `top_k` features whose decoders point along `direction`."""
    return score_features_by_decoder_projection(clt, direction, target_layer, top_k=top_k,
                                                cosine=cosine, target=target)


# -- full attribution graphs -----------------------------------------------------------
@attrs.define
class _Setup:
    """Everything phase 0 precomputes (no gradients)."""

    feats: torch.Tensor  # [n, 3] (layer, pos, index), lexicographic
    values: torch.Tensor  # [n]
    enc_vecs: torch.Tensor  # [n, d_model]
    dec_vecs: list[torch.Tensor]  # per source layer: [n_l, n_targets, d_model], scaled by acts
    layer_slices: list[slice]  # per source layer: its rows of feats
    errors: torch.Tensor  # [n_layers, seq, d_model]
    tokens: torch.Tensor  # [seq, d_model]
    logits: torch.Tensor  # [seq, vocab]


def _setup(model: Any, clt: CrossLayerTranscoder, ids: torch.Tensor, zero_positions: int) -> _Setup:
    L = clt.n_layers
    spec = HookSpec().capture("hook_embed")
    for i in range(L):
        spec.capture(clt.input_hook(i)).capture(clt.output_hook(i))
    with torch.no_grad():
        cache = model.forward(ids, spec)
    x_in = torch.stack([cache[clt.input_hook(i)][0] for i in range(L)]).to(clt.dtype)
    out = torch.stack([cache[clt.output_hook(i)][0] for i in range(L)]).to(clt.dtype)
    with torch.no_grad():
        acts = clt.encode(x_in)  # [L, seq, F]
        acts[:, :zero_positions] = 0
        recon = clt.decode(acts)
    feats = acts.nonzero()  # lexicographic (layer, pos, index), as a coalesced sparse tensor
    values = acts[feats[:, 0], feats[:, 1], feats[:, 2]]
    enc, dec, slices = [], [], []
    start = 0
    for layer in range(L):
        m = feats[:, 0] == layer
        n = int(m.sum())
        slices.append(slice(start, start + n))
        start += n
        idx = feats[m, 2]
        enc.append(clt.encoder(layer)[idx] if n else
                   torch.zeros(0, clt.d_model, dtype=clt.dtype, device=clt.device))
        rows = clt.decoder_rows(layer, idx) if n else \
            torch.zeros(0, len(clt.target_layers(layer)), clt.d_model, dtype=clt.dtype,
                        device=clt.device)
        dec.append(rows * values[m][:, None, None])
    errors = out - recon
    errors[:, :zero_positions] = 0
    return _Setup(feats=feats, values=values, enc_vecs=torch.cat(enc), dec_vecs=dec,
                  layer_slices=slices, errors=errors, tokens=cache["hook_embed"][0].to(clt.dtype),
                  logits=cache.output[0].detach())


class _ReplacementRun:
    """One batched forward of the local replacement model; `rows` runs a backward pass."""

    def __init__(self, model: Any, clt: CrossLayerTranscoder, ids: torch.Tensor, batch: int,
                 s: _Setup) -> None:
        self.clt, self.s, self.L = clt, s, clt.n_layers
        self.inputs: dict[int, torch.Tensor] = {}
        self.leaves: dict[int, torch.Tensor] = {}
        spec = HookSpec()
        freeze = lambda t, hook: t.detach()  # noqa: E731  frozen: value kept, no gradient
        # The MLP's output is replaced by a leaf, so no gradient may flow through the MLP:
        # cutting its input and hidden state too saves the memory and time autograd would
        # spend recording it (unless the CLT reads the MLP input itself).
        mlp_cut = {"mlp.hook_post"} if clt.files.feature_output_hook == "hook_mlp_out" else set()
        if mlp_cut and clt.files.feature_input_hook != "mlp.hook_in":
            mlp_cut.add("mlp.hook_in")
        for hp in model.hook_points():
            if (hp.suffix.endswith("hook_scale") or hp.suffix == "attn.hook_pattern"
                    or hp.suffix in mlp_cut):
                spec.intervene(hp, freeze)
        spec.intervene("hook_embed", self._leaf(-1))
        for i in range(self.L):
            spec.intervene(clt.input_hook(i), self._keep(i))
            spec.intervene(clt.output_hook(i), self._leaf(i))
        spec.intervene("ln_final.hook_normalized", self._keep(self.L))
        with torch.enable_grad():
            model.forward(ids.expand(batch, -1), spec)
        missing = [i for i in range(-1, self.L) if i not in self.leaves]
        if missing or len(self.inputs) != self.L + 1:
            raise MIError("the backend did not call every hook attribution needs "
                          f"(embed, {clt.input_hook(0).suffix}, {clt.output_hook(0).suffix}, "
                          "ln_final.hook_normalized)")

    def _leaf(self, key: int) -> Any:
        def fn(t: torch.Tensor, hook: Any) -> torch.Tensor:
            leaf = t.detach().requires_grad_(True)
            self.leaves[key] = leaf
            return leaf
        return fn

    def _keep(self, key: int) -> Any:
        def fn(t: torch.Tensor, hook: Any) -> torch.Tensor:
            self.inputs[key] = t
            return t
        return fn

    def rows(self, layers: torch.Tensor, positions: torch.Tensor, vecs: torch.Tensor
             ) -> torch.Tensor:
        """Direct effects of every source node on b targets: [b, n_sources]. Target i is
        ``<x[layers[i]][i, positions[i]], vecs[i]>`` where x[l] is layer l's input hook
        (l = n_layers: the final norm's output)."""
        s, b = self.s, len(layers)
        outs, grads = [], []
        for layer in layers.unique().tolist():
            m = (layers == layer).nonzero().flatten()
            x = self.inputs[layer]
            g = torch.zeros_like(x)
            g[m, positions[m]] = vecs[m].to(x.dtype)
            outs.append(x)
            grads.append(g)
        leaves = [self.leaves[i] for i in range(self.L)] + [self.leaves[-1]]
        got = torch.autograd.grad(outs, leaves, grads, retain_graph=True, allow_unused=True)
        gm = [torch.zeros_like(leaves[i]) if got[i] is None else got[i] for i in range(self.L)]
        ge = torch.zeros_like(leaves[-1]) if got[-1] is None else got[-1]
        gm = [t[:b].to(self.clt.dtype) for t in gm]
        ge = ge[:b].to(self.clt.dtype)
        feat_cols = []
        for src in range(self.L):
            sl = s.layer_slices[src]
            dec = s.dec_vecs[src]  # [n, n_targets, d]
            pos = s.feats[sl, 1]
            acc = torch.zeros(b, dec.shape[0], dtype=self.clt.dtype, device=gm[0].device)
            for j, tgt in enumerate(self.clt.target_layers(src)):
                acc += torch.einsum("bnd,nd->bn", gm[tgt][:, pos], dec[:, j])
            feat_cols.append(acc)
        err = torch.stack([torch.einsum("bpd,pd->bp", gm[l], s.errors[l]) for l in range(self.L)],
                          dim=1).reshape(b, -1)
        tok = torch.einsum("bpd,pd->bp", ge, s.tokens)
        return torch.cat(feat_cols + [err, tok], dim=1)


def select_logits(logits: torch.Tensor, max_n_logits: int, desired_logit_prob: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, probabilities) of the most probable next tokens, up to `max_n_logits` and
    until their cumulative probability reaches `desired_logit_prob` (circuit-tracer's rule)."""
    probs = torch.softmax(logits.float(), dim=-1)
    top_p, top_i = probs.topk(max_n_logits)
    cutoff = int(torch.searchsorted(top_p.cumsum(0),
                                    torch.tensor(desired_logit_prob, device=top_p.device))) + 1
    return top_i[:cutoff], top_p[:cutoff]


def _through_final_gain(model: Any, vecs: torch.Tensor) -> torch.Tensor:
    """Unembedding directions vecs [k, d_model] (read after the final norm's gain and bias)
    as gradients at ``ln_final.hook_normalized`` (before the gain, as TransformerLens): the
    transpose of the norm's map with its divisor fixed to 1, whatever the family's gain is."""
    model.require(Readout, "attribution (logit directions at ln_final.hook_normalized)")
    final_norm = model.backend.final_norm
    with torch.enable_grad():
        n = torch.zeros(vecs.shape, dtype=model.dtype, device=model.device, requires_grad=True)
        y = final_norm(n, scale=torch.ones(vecs.shape[0], 1, dtype=model.dtype, device=model.device))
        (g,) = torch.autograd.grad(y, n, vecs.to(y.dtype))
    return g.to(vecs.dtype)


def attribute(model: Any, clt: CrossLayerTranscoder, ids: torch.Tensor | Sequence[int], *,
              max_n_logits: int = 10, desired_logit_prob: float = 0.95, batch_size: int = 64,
              max_feature_nodes: int | None = None, update_interval: int = 4,
              zero_positions: int = 1, verbose: bool = False) -> CircuitGraph:
    """The attribution graph of `model` + `clt` on one prompt ids [seq] or [1, seq].

    Features at the first `zero_positions` positions (BOS) are dropped, as circuit-tracer does.
    With `max_feature_nodes`, only that many features get their own incoming edges, chosen
    by influence on the logits as the computation proceeds (circuit-tracer's strategy).
    """
    ids = torch.as_tensor(ids, dtype=torch.long, device=model.device).reshape(1, -1)
    clt.check_model(model)
    model.require(WeightAccess, "attribution (the unembedding W_U)")
    get_weight = model.backend.get_weight
    s = _setup(model, clt, ids, zero_positions)
    seq, L = ids.shape[1], clt.n_layers
    logit_ids, logit_p = select_logits(s.logits[-1], max_n_logits, desired_logit_prob)
    w_u = get_weight("W_U").detach().to(clt.dtype)  # [d_model, vocab]
    logit_vecs = _through_final_gain(model, (w_u[:, logit_ids] - w_u.mean(dim=-1, keepdim=True)).T)
    n_feat, n_logit = s.feats.shape[0], len(logit_ids)
    n_src = n_feat + (L + 1) * seq
    n_nodes = n_src + n_logit
    n_expand = n_feat if max_feature_nodes is None else min(max_feature_nodes, n_feat)
    batch = max(1, min(batch_size, max(n_expand, n_logit)))
    run = _ReplacementRun(model, clt, ids, batch, s)

    cpu, dev = torch.device("cpu"), s.feats.device  # the graph is assembled on the CPU
    edges = torch.zeros(n_expand + n_logit, n_nodes, device=cpu)
    row_node = torch.zeros(n_expand + n_logit, dtype=torch.long, device=cpu)
    for i in range(0, n_logit, batch):
        j = min(i + batch, n_logit)
        edges[i:j, :n_src] = run.rows(torch.full((j - i,), L, device=dev),
                                      torch.full((j - i,), seq - 1, device=dev), logit_vecs[i:j])
        row_node[i:j] = torch.arange(n_src + i, n_src + j, device=cpu)
    st, visited = n_logit, torch.zeros(n_feat, dtype=torch.bool, device=cpu)
    bar = Progress(n_expand, "attribution rows", unit="row", enabled=verbose or None)
    while int(visited.sum()) < n_expand:
        if n_expand == n_feat:
            pending = torch.arange(n_feat, device=cpu)
        else:
            infl = partial_influences(edges[:st], logit_p, row_node[:st])
            rank = infl[:n_feat].argsort(descending=True)
            todo = min(update_interval * batch, n_expand - int(visited.sum()))
            pending = rank[~visited[rank]][:todo]
        for k in range(0, len(pending), batch):
            idx = pending[k:k + batch]
            edges[st:st + len(idx), :n_src] = run.rows(s.feats[idx, 0], s.feats[idx, 1],
                                                       s.enc_vecs[idx])
            row_node[st:st + len(idx)] = idx
            visited[idx] = True
            st += len(idx)
            bar.update(len(idx))
    bar.close()

    selected = visited.nonzero().flatten()
    cols = torch.cat([selected, torch.arange(n_feat, n_nodes, device=cpu)])
    edges = edges[:, cols]
    order = row_node.argsort()  # features (by index), then logits
    edges = edges[order]
    n = edges.shape[1]
    adj = torch.zeros(n, n, device=cpu)
    adj[:n_expand] = edges[:n_expand]
    adj[n - n_logit:] = edges[n_expand:]
    tok = model.tokenizer if model.has_tokenizer else None
    to_str = (lambda t: tok.decode([int(t)])) if tok is not None else (lambda t: str(int(t)))
    return CircuitGraph(
        input_tokens=ids[0].tolist(), token_strings=[to_str(t) for t in ids[0]], n_layers=L,
        active_features=s.feats[selected].clone(), activation_values=s.values[selected].float(),
        logit_tokens=logit_ids.tolist(), logit_strings=[to_str(t) for t in logit_ids],
        logit_probabilities=logit_p.float(), adjacency=adj, scan=str(clt.source.name))


__all__ = ["AttributionEdge", "AttributionGraph", "CircuitGraph", "attribute",
           "build_attribution_graph", "extract_decoder_vectors",
           "score_features_by_decoder_projection", "select_logits"]
