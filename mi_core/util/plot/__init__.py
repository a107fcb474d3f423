"""Pictures of analysis results through matplotlib (the optional extra ``mi-core[plot]``),
and one self-contained HTML report (no dependencies, pictures embedded).

Every ``plot_*`` function writes the format its path's extension names (.png, .svg or
.pdf; anything else is a ``ConfigError``) and returns the path. When ``figsize`` is None the
figure grows with the number of rows and columns so that every tick label stays readable;
a PNG is ``figsize * 100`` pixels. Probabilities and scores use a sequential colour scale
from 0; only signed effects (patching, differences) use a diverging scale centred at 0.
For interactive pages see :mod:`mi_core.viz`.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any, Sequence

import torch

from mi_core.plugin import MIError
from mi_core.util.plot._base import (  # noqa: F401  (the helpers keep their old names here)
    DPI, FORMATS, _DIV, _SEQ, _auto_size, _heatmap, _plt, _printable, _save, _shorten, _tok,
    default_title, picture_format, save_figure,
)
from mi_core.util.plot.graph import plot_attribution_graph
from mi_core.util.plot.scores import plot_head_scores, plot_sweep_aggregate

__all__ = ["DPI", "FORMATS", "html_report", "picture_format", "plot_attention",
           "plot_attribution_graph", "plot_dose_response", "plot_grid", "plot_head_scores",
           "plot_knockout", "plot_logit_lens", "plot_patching", "plot_sweep_aggregate",
           "save_figure"]


def plot_attention(pattern: torch.Tensor, tokens: Sequence[str], path: str | Path,
                   title: str = "attention", figsize: tuple[float, float] | None = None) -> Path:
    """pattern [seq_q, seq_k] (one head) or [heads, seq_q, seq_k] (mean over heads shown),
    rows = queries and columns = keys, labelled with `tokens`; sequential scale 0..1."""
    plt = _plt()
    p = pattern.float()
    if p.dim() == 3:
        p = p.mean(0)
    if p.dim() != 2:
        raise MIError(f"plot_attention expects [q, k] or [heads, q, k], got {list(pattern.shape)}")
    labels = ([f"{i}:{_tok(t)}" for i, t in enumerate(tokens)] if len(tokens) == p.shape[0]
              else list(tokens))
    fig, ax = plt.subplots(figsize=figsize or _auto_size(p.shape[0], p.shape[1], title=title))
    im = _heatmap(ax, p, labels, labels, _SEQ, center=False, vmax=1.0)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(_shorten(title), fontsize=10)
    fig.colorbar(im, ax=ax, label="attention weight", fraction=0.046, pad=0.03)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_grid(grid: torch.Tensor, rows: Sequence[str], cols: Sequence[str], path: str | Path,
              title: str = "", *, xlabel: str = "", ylabel: str = "",
              figsize: tuple[float, float] | None = None, signed: bool = True,
              vmin: float | None = None, vmax: float | None = None,
              colorbar_label: str = "") -> Path:
    """A heatmap [rows, cols]: diverging and centred at 0 when `signed` (effects), else a
    sequential scale from `vmin` (default 0) to `vmax` (scores, probabilities)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=figsize or _auto_size(len(rows), len(cols), title=title))
    im = _heatmap(ax, grid, cols, rows, _DIV if signed else _SEQ, center=signed, vmin=vmin,
                  vmax=vmax)
    ax.set_title(_shorten(title), fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax, label=colorbar_label, fraction=0.046, pad=0.03)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_patching(result: Any, path: str | Path, figsize: tuple[float, float] | None = None,
                  title: str | None = None) -> Path:
    """A PatchingResult as a layer x position (or head) heatmap, diverging around 0
    (0 = corrupted behaviour, 1 = clean); the title and colour bar name the metric and its
    units (``result.describe()``)."""
    t = default_title(f"{result.method} patching of {result.kind}", result, title)
    name = getattr(result, "metric_name", None) or "metric (unnamed)"
    units = getattr(result, "metric_units", None)
    norm = getattr(result, "normalised", True)
    return plot_grid(result.grid, [f"L{x}" for x in result.layers], result.columns, path,
                     title=t, xlabel="head" if result.kind == "z" else "position: token",
                     ylabel="layer", figsize=figsize, signed=True,
                     colorbar_label=(f"normalised {name}{f' ({units})' if units else ''}\n"
                                     "(patched - corrupted) / (clean - corrupted)") if norm
                     else f"{name}{f' ({units})' if units else ''}, raw")


def plot_logit_lens(result: Any, path: str | Path, figsize: tuple[float, float] | None = None,
                    title: str | None = None) -> Path:
    """A LogitLensResult as a table: one row per lens point (layer, or ``L3.mid``), the top-k
    tokens written in the cells and coloured by probability (sequential, 0..1). Tracked
    targets get a panel beside it: their probability at every lens point as a line, with
    the rank (1 = top) written where it is in the top 10."""
    plt = _plt()
    pts = result.points
    k = len(pts[0].top) if pts else 0
    targets = pts[0].targets if pts else []
    probs = torch.tensor([[t.prob for t in p.top] for p in pts]) if pts else torch.zeros(0, 0)
    if figsize is None:
        figsize = (max(5.0, 1.35 * k + 2.6) + (2.8 if targets else 0.0),
                   max(3.8, 0.25 * len(pts) + 1.9))
    fig = plt.figure(figsize=figsize, layout="constrained")
    grid = fig.add_gridspec(1, 2 if targets else 1,
                            width_ratios=[1.35 * k + 1.2, 2.3][: 2 if targets else 1])
    ax = fig.add_subplot(grid[0, 0])
    im = ax.imshow(probs.numpy(), cmap="Greens", vmin=0, vmax=1, aspect="auto",
                   interpolation="nearest")
    for r, p in enumerate(pts):
        for c, t in enumerate(p.top):
            ax.text(c, r, f"{_tok(t.token)} {t.prob:.2f}", ha="center", va="center",
                    fontsize=8, color="white" if t.prob > 0.6 else "black")
    ax.set_xticks(range(k), [f"rank {i + 1}" for i in range(k)], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(pts)), [p.label for p in pts], fontsize=8)
    ax.set_ylabel("after layer (.mid: between attention and MLP)" if any(
        p.label.endswith(".mid") for p in pts) else "after layer")
    if targets:
        _lens_targets(fig.add_subplot(grid[0, 1], sharey=ax), pts)
    toks = getattr(result, "prompt_tokens", None) or []
    pos = result.position
    where = (f"after token {pos} {_tok(toks[pos])}" if 0 <= pos < len(toks)
             else f"position {pos}")
    fig.suptitle(_shorten(title or f"logit lens, next-token prediction {where}"), fontsize=10)
    fig.colorbar(im, ax=ax, label="probability", fraction=0.04, pad=0.02,
                 location="left" if targets else "right")
    return save_figure(fig, path)


def _lens_targets(ax: Any, pts: Sequence[Any]) -> None:
    """The targets' probability per lens point (a line each), ranks written (1 = top)."""
    ys = list(range(len(pts)))
    colours = ["tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    for j, t0 in enumerate(pts[0].targets):
        col = colours[j % len(colours)]
        probs = [p.targets[j].prob for p in pts]
        ax.plot(probs, ys, "o-", color=col, ms=3, label=f"p({_tok(t0.token)})")
        last = None
        for y, p in zip(ys, pts):
            rank = p.targets[j].rank + 1
            if rank != last and rank <= 10:
                ax.annotate(f"#{rank}", (p.targets[j].prob, y), xytext=(4, -3),
                            textcoords="offset points", fontsize=7, color=col)
            last = rank
    ax.set_xlim(0, 1)
    ax.set_xlabel("probability (#n: rank, 1 = top)", fontsize=8)
    ax.tick_params(labelleft=False, labelsize=7)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("tracked tokens", fontsize=9)


def plot_knockout(result: Any, path: str | Path, k: int = 10,
                  figsize: tuple[float, float] | None = None, title: str | None = None) -> Path:
    """An AblationResult: the `k` most changed tokens' probability before and after the
    knockout as paired horizontal bars (legend), each labelled with its log-prob change."""
    plt = _plt()
    ch = result.top_changed_tokens(k)
    n = len(ch)
    fig, ax = plt.subplots(figsize=figsize or (7.0, max(3.0, 0.42 * n + 1.8)))
    ys = torch.arange(n).float().numpy()
    before = [c.baseline_prob for c in ch]
    after = [c.intervened_prob for c in ch]
    ax.barh(ys - 0.2, before, height=0.38, color="#9e9e9e", label="baseline")
    ax.barh(ys + 0.2, after, height=0.38, color="#1f77b4", label="knocked out")
    for y, c in zip(ys, ch):
        ax.text(max(c.baseline_prob, c.intervened_prob) + 0.01, y,
                f"\u0394log p {c.logprob_diff:+.2f}", va="center", fontsize=7)
    ax.set_yticks(ys, [_tok(c.token) for c in ch], fontsize=8)
    ax.invert_yaxis()
    top = max(before + after + [0.05])
    ax.set_xlim(0, min(1.0, top * 1.25 + 0.1))
    ax.set_xlabel("next-token probability")
    kl = result.kl_divergence()
    kind = "attention knockout" if getattr(result, "spec", None) is not None else "ablation"
    t = default_title(kind, result, title)
    sub = (f"KL(baseline || knocked out) = {kl:.3f} nats; {n} most changed tokens, "
           "bars: probability, label: \u0394 log p (knocked out - baseline)")
    ax.set_title(_shorten(f"{t}\n{sub}", max_lines=6), fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_dose_response(curve: Any, path: str | Path, figsize: tuple[float, float] | None = None,
                       title: str | None = None) -> Path:
    """A DoseResponseCurve: KL vs strength, and (when tracked) the target's probability on a
    second axis; one legend names both series."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=figsize or (6.5, 4.8))
    xs = curve.strengths()
    lines = ax.plot(xs, curve.kls(), "o-", color="tab:blue", label="KL(baseline || steered)")
    ax.set_xlabel("strength s (attention scale on the steered edges)" if curve.kind ==
                  "attention" else "strength s (multiple of the direction added)")
    ax.set_ylabel("KL (nats)", color="tab:blue")
    ax.set_ylim(bottom=0)
    if curve.target_token is not None:
        ax2 = ax.twinx()
        name = getattr(curve, "target_token_str", None)
        label = f"p({_tok(name)})" if name is not None else "target probability"
        lines += ax2.plot(xs, curve.target_probs(), "s--", color="tab:red", label=label)
        if curve.baseline_prob is not None:
            lines += [ax2.axhline(curve.baseline_prob, color="tab:red", lw=0.8, ls=":",
                                  label=f"{label} unsteered")]
        ax2.set_ylabel("probability", color="tab:red")
        ax2.set_ylim(0, 1)
    ax.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    ax.set_title(_shorten(default_title(f"dose-response of {curve.kind} steering", curve, title),
                          max_lines=6), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def html_report(sections: Sequence[tuple[str, Any]], path: str | Path,
                title: str = "mi-core report", prompt: str | None = None) -> Path:
    """One self-contained HTML file: the title once, the prompt (when given), then each
    section (heading, content): a picture path (.png / .svg embedded as base64) or text
    (shown preformatted). A section whose heading equals the title gets no second heading."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             "</title><style>body{font-family:sans-serif;max-width:1000px;margin:auto}"
             "pre{background:#f6f6f6;padding:8px;overflow-x:auto}img{max-width:100%}"
             "</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    if prompt is not None:
        parts.append(f"<p>prompt: <code>{html.escape(prompt)}</code></p>")
    mime = {".png": "image/png", ".svg": "image/svg+xml"}
    for heading, content in sections:
        if heading and heading != title:
            parts.append(f"<h2>{html.escape(heading)}</h2>")
        if isinstance(content, Path) and content.suffix.lower() in mime:
            data = base64.b64encode(content.read_bytes()).decode("ascii")
            parts.append(f"<img alt='{html.escape(heading)}' "
                         f"src='data:{mime[content.suffix.lower()]};base64,{data}'>")
        else:
            parts.append(f"<pre>{html.escape(str(content))}</pre>")
    parts.append("</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
