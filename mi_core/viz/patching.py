"""The patching view: a layer x position (or head) grid of the normalised metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mi_core.viz._page import f32, write_page


def patching_html(result: Any, path: str | Path, title: str | None = None,
                  prompt: str | None = None, model_name: str = "") -> Path:
    """Write the page for a ``PatchingResult`` (grid [layers, columns], normalised metric)."""
    grid = result.grid.detach().float()
    data = {"kind": result.kind, "method": result.method, "grid": f32(grid),
            "layers": list(result.layers), "columns": list(result.columns),
            "column_kind": "head" if result.kind == "z" else "position",
            "clean_metric": float(result.clean_metric),
            "corrupted_metric": float(result.corrupted_metric)}
    longest = max((len(c) for c in result.columns), default=4)
    data["cell_width"] = int(min(120, max(44, 7 * longest + 8)))
    sub = ", ".join(x for x in (model_name, f"{result.method} patching of {result.kind}",
                                f"{grid.shape[0]} layers x {grid.shape[1]} columns") if x)
    corrupted = getattr(result, "corrupted_prompt", None)
    if corrupted is not None:
        sub += f"; corrupted prompt: {corrupted!r}"
    return write_page(path, "patching", title or f"activation patching: {result.kind}", data,
                      sub, prompt if prompt is not None else getattr(result, "clean_prompt", None))
