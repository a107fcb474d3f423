"""The patching view: a layer x position (or head) grid of the normalised metric, with the
metric's name and units, and the raw metric in the side panel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mi_core.plugin import ConfigError
from mi_core.viz._page import f32, write_page
from mi_core.viz._safe import MAX_LAYERS, MAX_TOKENS, check_size, check_tokens, number

_WHERE = "patching_html"


def patching_html(result: Any, path: str | Path, title: str | None = None,
                  prompt: str | None = None, model_name: str = "") -> Path:
    """Write the page for a ``PatchingResult`` (grid [layers, columns], normalised metric).

    The subtitle names the patched activation, the prompts and the metric with its units
    (``result.describe()``); NaN cells are shown as NaN (grey).
    """
    grid = result.grid
    if not isinstance(grid, torch.Tensor) or grid.dim() != 2:
        raise ConfigError(f"{_WHERE}: grid must be a 2-d tensor [layers, columns], got "
                          f"{getattr(grid, 'shape', type(grid).__name__)}")
    grid = grid.detach().float().cpu()
    layers, columns = list(result.layers), check_tokens(result.columns, f"{_WHERE}: columns")
    if tuple(grid.shape) != (len(layers), len(columns)):
        raise ConfigError(f"{_WHERE}: grid {list(grid.shape)} does not match {len(layers)} "
                          f"layers x {len(columns)} columns")
    check_size(len(layers), MAX_LAYERS, "layers", _WHERE, "patch fewer layers (layers=...)")
    check_size(len(columns), MAX_TOKENS, "columns", _WHERE, "patch fewer positions")
    name = getattr(result, "metric_name", None) or "the metric (unnamed)"
    units = getattr(result, "metric_units", None) or ""
    data = {"kind": str(result.kind), "method": str(result.method), "grid": f32(grid),
            "layers": [int(x) for x in layers], "columns": columns,
            "column_kind": "head" if result.kind in ("z", "q", "k", "v", "result", "pattern")
            else "position",
            "clean_metric": number(result.clean_metric, _WHERE, "clean_metric", optional=False),
            "corrupted_metric": number(result.corrupted_metric, _WHERE, "corrupted_metric",
                                       optional=False),
            "metric": str(name), "units": str(units),
            "normalised": bool(getattr(result, "normalised", True)),
            "clean_prompt": getattr(result, "clean_prompt", None),
            "corrupted_prompt": getattr(result, "corrupted_prompt", None)}
    longest = max((len(repr(c)) for c in columns), default=4)
    data["cell_width"] = int(min(130, max(46, 7 * longest + 8)))
    describe = getattr(result, "describe", None)
    sub = describe() if describe is not None else f"{result.method} patching of {result.kind}"
    model = model_name or getattr(result, "model", None) or ""
    head = f"activation patching of {result.kind}" + (f", {model}" if model else "")
    return write_page(path, "patching", title or head, data, sub,
                      prompt if prompt is not None else getattr(result, "clean_prompt", None))
