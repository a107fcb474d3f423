"""The logit-lens view: lens points x positions, the top-1 token in each cell, the tracked
targets' probability and rank drawn over the grid and as a line per position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mi_core.plugin import ConfigError
from mi_core.viz._page import f32, prompt_text, write_page
from mi_core.viz._safe import (
    MAX_LAYERS, MAX_VALUES, check_size, check_tokens, token_text,
)

_WHERE = "logit_lens_html"


def _from_result(r: Any) -> dict[str, Any]:
    """A single-position LogitLensResult as a one-column grid."""
    k = len(r.points[0].top) if r.points else 0
    vocab = {t.token_id: t.token for p in r.points for t in p.top + p.targets}
    tg = [t.token_id for t in r.points[0].targets] if r.points else []
    return {"labels": [p.label for p in r.points], "tokens": list(r.prompt_tokens),
            "positions": [r.position], "k": k,
            "top_ids": [[[t.token_id for t in p.top]] for p in r.points],
            "top_probs": f32(torch.tensor([[[t.prob for t in p.top]] for p in r.points])),
            "target_ids": tg,
            "target_probs": f32(torch.tensor([[[t.prob for t in p.targets]] for p in r.points])),
            "target_ranks": [[[t.rank for t in p.targets]] for p in r.points], "vocab": vocab}


def _from_grid(g: Any) -> dict[str, Any]:
    r, c = len(g.labels), len(g.tokens)
    if g.top_ids.dim() != 3 or tuple(g.top_ids.shape[:2]) != (r, c) \
            or g.top_probs.shape != g.top_ids.shape:
        raise ConfigError(f"{_WHERE}: top_ids {list(g.top_ids.shape)} and top_probs "
                          f"{list(g.top_probs.shape)} must both be [{r} points, {c} positions, k]")
    t = len(g.target_ids)
    for name in ("target_probs", "target_ranks"):
        if tuple(getattr(g, name).shape) != (r, c, t):
            raise ConfigError(f"{_WHERE}: {name} {list(getattr(g, name).shape)} must be "
                              f"[{r}, {c}, {t} targets]")
    return {"labels": list(g.labels), "tokens": list(g.tokens), "positions": list(range(c)),
            "k": int(g.top_ids.shape[-1]), "top_ids": g.top_ids.tolist(),
            "top_probs": f32(g.top_probs), "target_ids": [int(i) for i in g.target_ids],
            "target_probs": f32(g.target_probs), "target_ranks": g.target_ranks.tolist(),
            "vocab": g.vocab}


def _check(data: dict[str, Any]) -> None:
    data["tokens"] = check_tokens(data["tokens"], _WHERE)
    data["labels"] = check_tokens(data["labels"], f"{_WHERE}: labels", limit=2 * MAX_LAYERS)
    n = len(data["labels"]) * len(data["positions"]) * max(1, data["k"])
    check_size(n, MAX_VALUES, "top-k values", _WHERE, "lens fewer layers or positions, or a "
               "smaller k")
    vocab = {}
    for i, t in data["vocab"].items():
        if not isinstance(t, str):
            raise ConfigError(f"{_WHERE}: vocab entry {i} is {type(t).__name__}, not a string")
        vocab[int(i)] = t
    used = {i for row in data["top_ids"] for col in row for i in col} | set(data["target_ids"])
    missing = sorted(used - set(vocab))[:5]
    if missing:
        raise ConfigError(f"{_WHERE}: token ids {missing} appear in the lens but not in vocab")
    data["vocab"] = vocab


def logit_lens_html(result: Any, path: str | Path, title: str | None = None,
                    subtitle: str = "") -> Path:
    """Write the lens page for a ``LogitLensGrid`` (every position, from
    :func:`mi_core.interp.logit_lens_grid`) or a ``LogitLensResult`` (one position).

    Ranks are shown 1-based (1 = the top token), as the terminal prints them."""
    if hasattr(result, "points"):
        data, name, text = _from_result(result), "", None
    else:
        data, name, text = _from_grid(result), result.model_name, getattr(result, "prompt", None)
    _check(data)
    longest = max((len(token_text(s)) for s in data["vocab"].values()), default=4)
    data["cell_width"] = int(min(118, max(48, 7 * longest + 10)))
    targets = ", ".join(token_text(data["vocab"][i]) for i in data["target_ids"])
    sub = subtitle or (
        f"the residual stream after each layer read through the final norm and unembedding, "
        f"{len(data['labels'])} lens points x {len(data['positions'])} positions"
        + (f"; tracking {targets} (probability and rank, rank 1 = top)" if targets else ""))
    head = "logit lens" + (f", {name}" if name else "")
    return write_page(path, "lens", title or head, data, sub,
                      text if text is not None else prompt_text(data["tokens"]))
