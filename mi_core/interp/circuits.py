"""Static circuit analysis from the weights (QK / OV circuits, composition) and head
detection from attention patterns (previous-token, duplicate-token, induction).

Weights come from ``model.backend.get_weight(name, layer)`` in TransformerLens names and
shapes (W_Q [H, D, dh], W_K / W_V [H_kv, D, dh], W_O [H, dh, D]); with grouped-query
attention, query head ``h`` uses kv head ``h // (H / H_kv)``. Norm weights are not folded
in unless ``fold_ln=True`` (then ``ln1.w`` scales the rows of W_Q, W_K and W_V; for
norms whose gain is ``1 + w`` this fold is not the true gain).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import attrs
import torch

from mi_core.plugin import (
    HookPoint, HookSpec, MIError, MIModel, WeightAccess, require_points, view,
)
from mi_core.interp._common import as_ids, check_heads, check_layers, progress
from mi_core.interp.describe import model_label
from mi_core.tl.factored_matrix import FactoredMatrix


def _kv_index(model: MIModel, heads: list[int], kv: torch.Tensor) -> list[int]:
    """The key / value head each query head in `heads` reads, from the layer's own stored
    `kv` [kv_heads, ...] (the KV-head count can differ per layer)."""
    rep = model.num_heads // kv.shape[0]
    return [h // rep for h in heads]


def _w(model: MIModel, name: str, layer: int) -> torch.Tensor:
    model.require(WeightAccess, f"weight {name} (circuit analysis)")
    return model.backend.get_weight(name, layer).float()


def _ln1(model: MIModel, layer: int, fold_ln: bool) -> torch.Tensor | None:
    return _w(model, "ln1.w", layer) if fold_ln else None


def qk_circuit(model: MIModel, layer: int, heads: Sequence[int] | None = None,
               fold_ln: bool = False) -> FactoredMatrix:
    """``W_Q[h] @ W_K[h].T``: [heads, D, D] (factored, inner d_head): query-side residual x
    key-side residual -> attention score (before RoPE and the 1/sqrt(d_head) scaling)."""
    (layer,) = check_layers([layer], model.num_layers)
    hs = check_heads(heads, model.num_heads)
    wq = _w(model, "W_Q", layer)[hs]
    wk = _w(model, "W_K", layer)
    wk = wk[_kv_index(model, hs, wk)]
    w = _ln1(model, layer, fold_ln)
    if w is not None:
        wq, wk = wq * w[:, None], wk * w[:, None]
    return FactoredMatrix(wq, wk.transpose(-1, -2))


def ov_circuit(model: MIModel, layer: int, heads: Sequence[int] | None = None,
               fold_ln: bool = False) -> FactoredMatrix:
    """``W_V[h] @ W_O[h]``: [heads, D, D] (factored): what a head writes for what it reads."""
    (layer,) = check_layers([layer], model.num_layers)
    hs = check_heads(heads, model.num_heads)
    wv = _w(model, "W_V", layer)
    wv = wv[_kv_index(model, hs, wv)]
    w = _ln1(model, layer, fold_ln)
    if w is not None:
        wv = wv * w[:, None]
    return FactoredMatrix(wv, _w(model, "W_O", layer)[hs])


@attrs.define
class CompositionScores:
    """scores[l1, h1, l2, h2] = ||W_A(l1,h1) @ W_B(l2,h2)||_F / (||W_A|| ||W_B||) for l1 < l2
    (0 elsewhere); ``kind`` is "q", "k" or "v" (TransformerLens' definition)."""

    kind: str
    scores: torch.Tensor

    def top(self, k: int = 10) -> list[tuple[int, int, int, int, float]]:
        flat = self.scores.flatten()
        L, H = self.scores.shape[:2]
        idx = flat.topk(min(k, flat.numel())).indices
        out = []
        for i in idx.tolist():
            l1, r = divmod(i, H * L * H)
            h1, r = divmod(r, L * H)
            l2, h2 = divmod(r, H)
            out.append((l1, h1, l2, h2, float(flat[i])))
        return out


def _r_factor(m: torch.Tensor) -> torch.Tensor:
    # ||Q R X||_F = ||R X||_F for orthonormal Q: norms of products use only the small R.
    return torch.linalg.qr(m, mode="r").R


def composition_scores(model: MIModel, kind: str = "k", fold_ln: bool = False,
                       show_progress: bool | None = None) -> CompositionScores:
    """Q-, K- or V-composition of every earlier head's OV circuit with every later head's
    QK (q: ``OV1 @ QK2``, k: ``OV1 @ QK2.T``) or OV (v: ``OV1 @ OV2``) circuit."""
    if kind not in ("q", "k", "v"):
        raise MIError(f"composition kind must be 'q', 'k' or 'v', got {kind!r}")
    L, H = model.num_layers, model.num_heads
    ov = [ov_circuit(model, i, fold_ln=fold_ln) for i in range(L)]
    if kind == "v":
        right = ov
    else:
        qk = [qk_circuit(model, i, fold_ln=fold_ln) for i in range(L)]
        right = qk if kind == "q" else [m.T for m in qk]
    # OV1 = A1 B1 (A1 [D,dh] of the reading side, B1 [dh,D]); right = A2 B2.
    ra1 = [_r_factor(m.A) for m in ov]  # [H, dh, dh]
    n1 = [m.norm() for m in ov]  # [H]
    rb2 = [_r_factor(m.B.transpose(-1, -2)) for m in right]  # [H, dh, dh]
    n2 = [m.norm() for m in right]
    scores = torch.zeros(L, H, L, H)
    for l1 in progress(range(L), f"{kind}-composition", enabled=show_progress):
        for l2 in range(l1 + 1, L):
            mid = ov[l1].B[:, None] @ right[l2].A[None]  # [H1, H2, dh, dh]
            prod = ra1[l1][:, None] @ mid @ rb2[l2][None].transpose(-1, -2)
            num = prod.flatten(-2).norm(dim=-1)
            scores[l1, :, l2, :] = num / (n1[l1][:, None] * n2[l2][None, :])
    return CompositionScores(kind, scores)


# -- head detection --------------------------------------------------------------------

HEAD_KINDS = ("previous_token", "duplicate_token", "induction")


def detection_pattern(kind: str, tokens: torch.Tensor) -> torch.Tensor:
    """The ideal attention pattern [seq, seq] (bool) of a head of `kind` on `tokens` [seq]."""
    s = tokens.shape[0]
    q = torch.arange(s)[:, None]
    k = torch.arange(s)[None, :]
    if kind == "previous_token":
        return k == q - 1
    same = (tokens[:, None] == tokens[None, :]) & (k < q)
    if kind == "duplicate_token":
        return same
    if kind == "induction":
        # attend to the token right after an earlier occurrence of the current token
        out = torch.zeros(s, s, dtype=torch.bool)
        out[:, 1:] = same[:, :-1] & (k[:, 1:] < q)
        return out
    raise MIError(f"unknown head kind {kind!r}; one of {HEAD_KINDS}")


def head_scores(pattern: torch.Tensor, ideal: torch.Tensor) -> torch.Tensor:
    """pattern [batch, heads, q, k], ideal [batch, q, k] -> [heads]: the attention mass on the
    ideal edges, averaged over the query rows that have at least one ideal edge."""
    ideal = ideal.to(pattern.dtype)
    rows = ideal.sum(-1) > 0  # [batch, q]
    mass = (pattern * ideal[:, None]).sum(-1)  # [batch, heads, q]
    n = rows.sum().clamp_min(1)
    return (mass * rows[:, None]).sum((0, 2)) / n


@attrs.define
class HeadDetectionResult:
    """scores[kind] = [layers, heads] tensor; ``top(kind)`` lists the best heads.
    ``model`` names the model and ``description`` the input the scores were measured on.
    A layer that was not scored (not asked for, or a hybrid's recurrent layer) is NaN, and
    ``top`` / ``heads_above`` never list it."""

    scores: dict[str, torch.Tensor]
    num_tokens: int
    model: str | None = None
    description: str | None = None

    def to_html(self, path: str | Path, title: str | None = None) -> Path:
        """An interactive page: one layers x heads grid per kind, hover for every score."""
        return view("head_scores")(self, path, title=title)

    def top(self, kind: str, k: int = 5) -> list[tuple[int, int, float]]:
        s = self.scores[kind]
        flat = s.flatten()
        scored = flat.isfinite()
        idx = flat.nan_to_num(float("-inf")).topk(min(k, int(scored.sum()))).indices.tolist()
        return [(i // s.shape[1], i % s.shape[1], float(flat[i])) for i in idx]

    def heads_above(self, kind: str, threshold: float) -> list[tuple[int, int, float]]:
        s = self.scores[kind]
        return [(int(a), int(b), float(s[a, b])) for a, b in (s > threshold).nonzero().tolist()]


def repeated_random_tokens(model: MIModel, length: int = 20, batch: int = 4, seed: int = 0,
                           low: int = 1000) -> torch.Tensor:
    """Token ids [batch, 1 + 2 * length]: BOS (when the tokenizer has one) + random tokens
    repeated once.

    Tokens are drawn from ``[low, vocab)`` so special tokens are avoided.
    """
    g = torch.Generator().manual_seed(seed)
    low = min(low, model.vocab_size // 2)
    r = torch.randint(low, model.vocab_size, (batch, length), generator=g)
    ids = torch.cat([r, r], 1)
    bos = model.tokenizer.bos_token_id if model.has_tokenizer else None
    if bos is not None:
        ids = torch.cat([torch.full((batch, 1), bos), ids], 1)
    return ids.to(model.device)


def detect_heads(model: MIModel, ids: Any | None = None, kinds: Sequence[str] = HEAD_KINDS,
                 layers: Sequence[int] | None = None, show_progress: bool | None = None
                 ) -> HeadDetectionResult:
    """Score every head for each kind on `ids` (default: repeated random tokens, where
    induction and duplicate heads are visible). BOS is never counted as an ideal target.

    `layers` None: every layer with attention (a hybrid's attention layers; a model with
    none is refused naming its first layer); a listed layer without attention is a typed
    refusal naming it. Layers not scored are NaN in the result."""
    what = None
    if ids is None:
        ids = repeated_random_tokens(model)
        what = f"{ids.shape[0]} x random tokens repeated once ({ids.shape[1]} tokens)"
    ids = as_ids(model, ids)
    if layers is None:  # the attention layers; none at all: refused below, naming layer 0
        layers = [i for i in range(model.num_layers)
                  if model.has_hook_point(HookPoint.attn_pattern(i))] or None
    layers = check_layers(layers, model.num_layers)
    points = [HookPoint.attn_pattern(i) for i in layers]
    require_points(model, points)
    ideals = {k: torch.stack([detection_pattern(k, row.cpu()) for row in ids]) for k in kinds}
    scores = {k: torch.full((model.num_layers, model.num_heads), float("nan")) for k in kinds}
    cache = model.forward(ids, HookSpec().capture_all(points))
    for i, hp in zip(progress(layers, "heads", enabled=show_progress), points):
        pat = cache.require(hp).float().cpu()
        for k in kinds:
            scores[k][i] = head_scores(pat, ideals[k])
    return HeadDetectionResult(scores, int(ids.shape[1]), model_label(model),
                               what or f"{ids.shape[0]} x {ids.shape[1]} tokens")
