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
import textwrap
from pathlib import Path
from typing import Any, Sequence

import torch

from mi_core.plugin import ConfigError, MIError

DPI = 100
#: extension -> matplotlib format
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
_SEQ, _DIV = "Blues", "RdBu_r"


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MIError("plots need matplotlib: pip install 'mi-core[plot]'") from exc
    return plt


def picture_format(path: str | Path) -> str:
    """The matplotlib format for `path`'s extension; ConfigError for any other."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ConfigError(f"{str(path)!r}: pictures are written as {', '.join(FORMATS)} "
                          f"(chosen by the extension), not {suffix or 'no extension'!r}; "
                          "interactive .html pages come from mi_core.viz / --plot OUT.html")
    return FORMATS[suffix]


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write `fig` in the format its extension names (checked first), then close it."""
    fmt = picture_format(path)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format=fmt)
    _plt().close(fig)
    return path


_save = save_figure


def _printable(label: str) -> str:
    """Tick labels: control characters escaped (fonts have no glyph for them), '$' kept
    literal (matplotlib would start math mode)."""
    s = label if label.isprintable() else repr(label)[1:-1]
    return s.replace("$", r"\$")


def _tok(token: str) -> str:
    """A token as the CLI prints it, quoted, so ' Paris' and 'Paris' differ: "' Paris'"."""
    return _printable(repr(token))


def _shorten(title: str, width: int = 90, max_lines: int = 4) -> str:
    """Long title lines (a long prompt) wrapped at `width`; at most `max_lines` lines."""
    lines: list[str] = []
    for line in title.split("\n"):
        lines += textwrap.wrap(line, width) or [""]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: width - 1] + "\u2026"
    return "\n".join(lines)


def _auto_size(rows: int, cols: int, cell: float = 0.32, extra_w: float = 2.6,
               extra_h: float = 2.2, min_w: float = 5.0, min_h: float = 3.5,
               max_side: float = 40.0, title: str = "") -> tuple[float, float]:
    """A figure size that gives each cell about `cell` inches (room for a tick label) and
    the title room on one line per line."""
    min_w = max(min_w, 0.075 * max((len(x) for x in title.split("\n")), default=0) + 0.5)
    w = min(max(min_w, cols * cell + extra_w), max_side)
    h = min(max(min_h, rows * cell + extra_h), max_side)
    return (w, h)


def _heatmap(ax: Any, data: torch.Tensor, xlabels: Sequence[str], ylabels: Sequence[str],
             cmap: str, center: bool, vmin: float | None = None,
             vmax: float | None = None) -> Any:
    d = data.detach().float().cpu().numpy()
    xlabels, ylabels = [_printable(x) for x in xlabels], [_printable(y) for y in ylabels]
    kw: dict[str, Any] = {"cmap": cmap, "aspect": "auto", "interpolation": "nearest"}
    if center:
        m = float(abs(d).max()) if d.size else 1.0
        kw.update(vmin=-(m or 1.0), vmax=m or 1.0)
    else:
        kw.update(vmin=0.0 if vmin is None else vmin, vmax=vmax)
    im = ax.imshow(d, **kw)
    fs = 8 if max(len(xlabels), len(ylabels)) <= 40 else 6
    step_x = max(1, len(xlabels) // 80)
    step_y = max(1, len(ylabels) // 80)
    rot = 0 if all(len(x) <= 3 for x in xlabels) else 90
    ax.set_xticks(range(0, len(xlabels), step_x), xlabels[::step_x], rotation=rot, fontsize=fs)
    ax.set_yticks(range(0, len(ylabels), step_y), ylabels[::step_y], fontsize=fs)
    return im


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
    (0 = corrupted behaviour, 1 = clean)."""
    t = title or f"{result.method} patching of {result.kind}"
    if result.clean_prompt is not None and title is None:
        t += f"\nclean {result.clean_prompt!r} vs corrupted {result.corrupted_prompt!r}"
    return plot_grid(result.grid, [f"L{x}" for x in result.layers], result.columns, path,
                     title=t, xlabel="head" if result.kind == "z" else "position: token",
                     ylabel="layer", figsize=figsize, signed=True,
                     colorbar_label="(patched - corrupted) / (clean - corrupted)")


def plot_logit_lens(result: Any, path: str | Path, figsize: tuple[float, float] | None = None,
                    title: str | None = None) -> Path:
    """A LogitLensResult as a table: one row per lens point (layer, or ``L3.mid``), the top-k
    tokens written in the cells and coloured by probability (sequential, 0..1)."""
    plt = _plt()
    pts = result.points
    k = len(pts[0].top) if pts else 0
    probs = torch.tensor([[t.prob for t in p.top] for p in pts]) if pts else torch.zeros(0, 0)
    if figsize is None:
        figsize = (max(5.0, 1.35 * k + 2.6), max(3.5, 0.25 * len(pts) + 1.6))
    fig, ax = plt.subplots(figsize=figsize)
    im = ax.imshow(probs.numpy(), cmap="Greens", vmin=0, vmax=1, aspect="auto",
                   interpolation="nearest")
    fs = 8
    for r, p in enumerate(pts):
        for c, t in enumerate(p.top):
            ax.text(c, r, f"{_tok(t.token)} {t.prob:.2f}", ha="center", va="center",
                    fontsize=fs, color="white" if t.prob > 0.6 else "black")
    ax.set_xticks(range(k), [f"top {i + 1}" for i in range(k)], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(pts)), [p.label for p in pts], fontsize=fs)
    ax.set_ylabel("after layer (.mid: between attention and MLP)" if any(
        p.label.endswith(".mid") for p in pts) else "after layer")
    toks = getattr(result, "prompt_tokens", None) or []
    pos = result.position
    where = (f"after token {pos} {_tok(toks[pos])}" if 0 <= pos < len(toks)
             else f"position {pos}")
    ax.set_title(_shorten(title or f"logit lens {where}"), fontsize=10)
    fig.colorbar(im, ax=ax, label="probability", fraction=0.04)
    fig.tight_layout()
    return save_figure(fig, path)


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
    t = title or "attention knockout"
    spec = getattr(result, "spec", None)
    sub = f"KL(baseline || knocked out) = {kl:.3f} nats; {n} most changed tokens"
    if spec is not None:
        heads = "all heads" if spec.heads is None else f"heads {_fmt_list(spec.heads)}"
        layers = "all layers" if spec.layers is None else f"layers {_fmt_list(spec.layers)}"
        sub = f"{layers}, {heads}; " + sub
    ax.set_title(_shorten(f"{t}\n{sub}"), fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def _fmt_list(v: Sequence[int] | None) -> str:
    if v is None:
        return "all"
    v = list(v)
    if len(v) > 2 and v == list(range(v[0], v[-1] + 1)):
        return f"{v[0]}-{v[-1]}"
    return ",".join(map(str, v))


def plot_dose_response(curve: Any, path: str | Path, figsize: tuple[float, float] | None = None,
                       title: str | None = None) -> Path:
    """A DoseResponseCurve: KL vs strength, and (when tracked) the target's probability on a
    second axis; one legend names both series."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=figsize or (6.5, 4.8))
    xs = curve.strengths()
    lines = ax.plot(xs, curve.kls(), "o-", color="tab:blue", label="KL(baseline || steered)")
    ax.set_xlabel("steering strength (attention scale)" if curve.kind == "attention"
                  else "steering strength")
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
    ax.set_title(_shorten(title or f"dose-response ({curve.kind} steering)"), fontsize=10)
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
