"""Pictures of analysis results: PNG through matplotlib (the optional extra ``mi-core[plot]``)
and one self-contained HTML report (no dependencies, PNGs embedded as base64).

Every ``plot_*`` function writes a PNG of ``figsize * dpi`` pixels and returns its path.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any, Sequence

import torch

from mi_core.errors import MIError

DPI = 100


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MIError("plots need matplotlib: pip install 'mi-core[plot]'") from exc
    return plt


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    _plt().close(fig)
    return path


def _printable(label: str) -> str:
    """Tick labels: control characters escaped (fonts have no glyph for them)."""
    return label if label.isprintable() else repr(label)[1:-1]


def _heatmap(ax: Any, data: torch.Tensor, xlabels: Sequence[str], ylabels: Sequence[str],
             cmap: str, center: bool) -> Any:
    d = data.detach().float().cpu().numpy()
    xlabels, ylabels = [_printable(x) for x in xlabels], [_printable(y) for y in ylabels]
    kw: dict[str, Any] = {"cmap": cmap, "aspect": "auto", "interpolation": "nearest"}
    if center:
        m = float(abs(d).max()) or 1.0
        kw.update(vmin=-m, vmax=m)
    im = ax.imshow(d, **kw)
    if len(xlabels) <= 64:
        ax.set_xticks(range(len(xlabels)), list(xlabels), rotation=90, fontsize=7)
    if len(ylabels) <= 64:
        ax.set_yticks(range(len(ylabels)), list(ylabels), fontsize=7)
    return im


def plot_attention(pattern: torch.Tensor, tokens: Sequence[str], path: str | Path,
                   title: str = "attention", figsize: tuple[float, float] = (6, 5)) -> Path:
    """pattern [seq_q, seq_k] (one head) or [heads, seq_q, seq_k] (mean over heads shown)."""
    plt = _plt()
    p = pattern.float()
    if p.dim() == 3:
        p = p.mean(0)
    if p.dim() != 2:
        raise MIError(f"plot_attention expects [q, k] or [heads, q, k], got {list(pattern.shape)}")
    fig, ax = plt.subplots(figsize=figsize)
    im = _heatmap(ax, p, tokens, tokens, "Blues", center=False)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return _save(fig, path)


def plot_grid(grid: torch.Tensor, rows: Sequence[str], cols: Sequence[str], path: str | Path,
              title: str = "", xlabel: str = "", ylabel: str = "",
              figsize: tuple[float, float] = (8, 6)) -> Path:
    """A diverging heatmap [rows, cols] centred at 0 (patching grids, head scores)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=figsize)
    im = _heatmap(ax, grid, cols, rows, "RdBu_r", center=True)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return _save(fig, path)


def plot_patching(result: Any, path: str | Path, figsize: tuple[float, float] = (8, 6)) -> Path:
    """A PatchingResult as a layer x position (or head) heatmap."""
    return plot_grid(result.grid, [str(x) for x in result.layers], result.columns, path,
                     title=f"{result.method} patching: {result.kind} (1 = clean, 0 = corrupted)",
                     xlabel="head" if result.kind == "z" else "position", ylabel="layer",
                     figsize=figsize)


def plot_logit_lens(result: Any, path: str | Path, figsize: tuple[float, float] = (8, 8)) -> Path:
    """A LogitLensResult as a table: one row per lens point, top-k tokens coloured by prob."""
    plt = _plt()
    pts = result.points
    k = len(pts[0].top) if pts else 0
    probs = torch.tensor([[t.prob for t in p.top] for p in pts]) if pts else torch.zeros(0, 0)
    fig, ax = plt.subplots(figsize=figsize)
    ax.imshow(probs.numpy(), cmap="Greens", vmin=0, vmax=1, aspect="auto")
    for r, p in enumerate(pts):
        for c, t in enumerate(p.top):
            ax.text(c, r, f"{t.token!r}\n{t.prob:.2f}", ha="center", va="center", fontsize=6)
    ax.set_xticks(range(k), [f"top {i + 1}" for i in range(k)], fontsize=7)
    ax.set_yticks(range(len(pts)), [p.label for p in pts], fontsize=7)
    ax.set_title(f"logit lens at position {result.position}")
    fig.tight_layout()
    return _save(fig, path)


def plot_dose_response(curve: Any, path: str | Path, figsize: tuple[float, float] = (6, 4)
                       ) -> Path:
    """A DoseResponseCurve: KL and (when tracked) the target's probability vs strength."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=figsize)
    xs = curve.strengths()
    ax.plot(xs, curve.kls(), "o-", label="KL(baseline || steered)")
    ax.set_xlabel("strength")
    ax.set_ylabel("KL (nats)")
    if curve.target_token is not None:
        ax2 = ax.twinx()
        ax2.plot(xs, curve.target_probs(), "s--", color="tab:red", label="target prob")
        ax2.set_ylabel("target probability")
    ax.set_title(f"dose-response ({curve.kind} steering)")
    fig.tight_layout()
    return _save(fig, path)


def html_report(sections: Sequence[tuple[str, Any]], path: str | Path,
                title: str = "mi-core report") -> Path:
    """One self-contained HTML file. Each section is (heading, content): a PNG path (embedded
    as base64), or text (shown preformatted)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             "</title><style>body{font-family:sans-serif;max-width:1000px;margin:auto}"
             "pre{background:#f6f6f6;padding:8px;overflow-x:auto}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    for heading, content in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        if isinstance(content, Path) and content.suffix.lower() == ".png":
            data = base64.b64encode(content.read_bytes()).decode("ascii")
            parts.append(f"<img alt='{html.escape(heading)}' src='data:image/png;base64,{data}'>")
        else:
            parts.append(f"<pre>{html.escape(str(content))}</pre>")
    parts.append("</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
