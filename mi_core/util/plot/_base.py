"""What every picture shares: matplotlib loaded on demand (the ``plot`` extra), the format
chosen by the extension, text that prints (tokens quoted as the terminal prints them,
invisible characters escaped), titles wrapped, figure sizes that grow with the data."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any, Sequence

import torch

from mi_core.interp.describe import visible
from mi_core.plugin import ConfigError, MIError

DPI = 100
#: extension -> matplotlib format
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
_SEQ, _DIV = "Blues", "RdBu_r"
_DOLLAR = re.compile(r"(?<!\\)\$")  # a '$' not yet escaped (matplotlib's math mode)


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


def _printable(label: Any) -> str:
    """Any text drawn (titles, tick labels): every character that does not print escaped
    (controls, bidi overrides, zero-width characters, lone surrogates: fonts have no glyph
    for them and some would reorder the text), '$' kept literal (no math mode)."""
    return _DOLLAR.sub(r"\\$", visible(label))


def _tok(token: str) -> str:
    """A token as the CLI prints it, quoted, so ' Paris' and 'Paris' differ: "' Paris'"."""
    return _DOLLAR.sub(r"\\$", repr(str(token)))


def _shorten(title: str, width: int = 90, max_lines: int = 4) -> str:
    """Long title lines (a long prompt) wrapped at `width`; at most `max_lines` lines."""
    lines: list[str] = []
    for line in str(title).split("\n"):  # the title's own line breaks; others escaped
        line = _printable(line)
        lines += textwrap.wrap(line, width, replace_whitespace=False) or [""]
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


def default_title(kind: str, result: Any, title: str | None = None) -> str:
    """`title`, or the default one of a result's picture: "<kind>, <model>", the result's
    one-line description (``result.describe()``: layers, heads, edges as query → key,
    hook point, strength, metric, sign convention) and the prompt."""
    if title is not None:
        return title
    model = getattr(result, "model", None)
    lines = [f"{kind}, {model}" if model else kind]
    describe = getattr(result, "describe", None)
    if callable(describe):
        lines.append(describe())
    prompt = getattr(result, "prompt", None) or getattr(result, "clean_prompt", None)
    if prompt:
        lines.append(f"prompt {prompt!r}")
    return "\n".join(lines)
