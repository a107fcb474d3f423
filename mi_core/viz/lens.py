"""The logit-lens view: lens points x positions, hover for top-k tokens and probabilities."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mi_core.viz._page import f32, prompt_text, write_page


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


def logit_lens_html(result: Any, path: str | Path, title: str | None = None) -> Path:
    """Write the lens page for a ``LogitLensGrid`` (every position, from
    :func:`mi_core.interp.logit_lens_grid`) or a ``LogitLensResult`` (one position)."""
    if hasattr(result, "points"):
        data, name, text = _from_result(result), "", None
    else:
        g = result
        data = {"labels": list(g.labels), "tokens": list(g.tokens),
                "positions": list(range(len(g.tokens))), "k": int(g.top_ids.shape[-1]),
                "top_ids": g.top_ids.tolist(), "top_probs": f32(g.top_probs),
                "target_ids": list(g.target_ids), "target_probs": f32(g.target_probs),
                "target_ranks": g.target_ranks.tolist(), "vocab": g.vocab}
        name = g.model_name
        text = getattr(g, "prompt", None)
    longest = max((len(s) for s in data["vocab"].values()), default=4)
    data["cell_width"] = int(min(110, max(44, 8 * longest + 8)))
    sub = ", ".join(x for x in (name, f"{len(data['labels'])} lens points",
                                f"{len(data['positions'])} positions") if x)
    return write_page(path, "lens", title or "logit lens", data, sub,
                      text if text is not None else prompt_text(data["tokens"]))
