"""The head-scores view: one layers x heads grid per kind (previous-token, duplicate-token,
induction), hover a cell for every kind's score of that head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mi_core.plugin import ConfigError
from mi_core.viz._page import f32, write_page
from mi_core.viz._safe import MAX_LAYERS, check_size

_WHERE = "head_scores_html"
#: what each kind's score measures (the attention on the ideal edges)
MEANINGS = {"previous_token": "attention to the previous token",
            "duplicate_token": "attention to earlier copies of the same token",
            "induction": "attention to the token after an earlier copy of the current one"}


def head_scores_html(result: Any, path: str | Path, title: str | None = None,
                     subtitle: str = "", model_name: str = "") -> Path:
    """Write the page for a ``HeadDetectionResult`` (``scores[kind]`` = [layers, heads])."""
    scores = getattr(result, "scores", None)
    if not isinstance(scores, dict) or not scores:
        raise ConfigError(f"{_WHERE}: result.scores must be a non-empty dict kind -> "
                          "[layers, heads] tensor")
    kinds, grids, shape = [], [], None
    for kind, s in scores.items():
        if not isinstance(s, torch.Tensor) or s.dim() != 2:
            raise ConfigError(f"{_WHERE}: scores[{kind!r}] must be a [layers, heads] tensor, "
                              f"got {getattr(s, 'shape', type(s).__name__)}")
        if shape is not None and tuple(s.shape) != shape:
            raise ConfigError(f"{_WHERE}: scores[{kind!r}] is {list(s.shape)}, the others "
                              f"{list(shape)}")
        shape = tuple(s.shape)
        kinds.append(str(kind))
        grids.append(s.detach().float().cpu())
    check_size(shape[0], MAX_LAYERS, "layers", _WHERE, "score fewer layers")
    check_size(shape[1], 4096, "heads", _WHERE, "score fewer heads")
    data = {"kinds": kinds, "scores": f32(torch.stack(grids)),
            "meanings": [MEANINGS.get(k, k) for k in kinds]}
    model = model_name or getattr(result, "model", None) or ""
    what = getattr(result, "description", None)
    sub = subtitle or ("score = mean attention on each kind's ideal edges (0..1), "
                       f"{shape[0]} layers x {shape[1]} heads"
                       + (f"; measured on {what}" if what else ""))
    head = "attention head scores" + (f", {model}" if model else "")
    return write_page(path, "heads", title or head, data, sub)
