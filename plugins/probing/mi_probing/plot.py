"""The metric-vs-layer picture of a sweep (matplotlib is optional: ``mi-core[plot]``)."""

from __future__ import annotations

import os
from pathlib import Path

from mi_core.plugin import ConfigError
from mi_probing.errors import ProbingError
from mi_probing.sweep import SweepResult, make_curve


def plot_sweep(result: SweepResult, path: str | os.PathLike[str],
               metric: str | None = None) -> Path:
    """Save a picture (.png, .svg or .pdf, by the extension; ConfigError for any other): the
    probe's score per hook point (±1 std over folds), the shuffled-label
    baseline (±1 std over shuffles) and the chance level. The x axis is the layer when every
    point has a distinct layer, otherwise the hook points in order."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ProbingError("plotting needs matplotlib: pip install 'mi-core[plot]' "
                           "(or pip install matplotlib)") from None
    fmt = _picture_format(path)  # before any work: '.jpg' is an error, not PNG bytes
    name = metric or result.metric
    curve = make_curve(result.probes, name) if name != result.metric else result.curve
    layers = [c.layer for c in curve]
    by_layer = None not in layers and len(set(layers)) == len(layers)
    xs = [float(c.layer or 0) for c in curve] if by_layer else [float(i) for i in range(len(curve))]
    fig = Figure(figsize=(max(6.0, 0.25 * len(xs) + 3), 4.0), dpi=120)
    ax = fig.add_subplot()
    vals = [c.value for c in curve]
    ax.errorbar(xs, vals, yerr=[c.std for c in curve], marker="o", capsize=3, label="probe")
    if all(c.baseline is not None for c in curve):
        ax.errorbar(xs, [c.baseline for c in curve], yerr=[c.baseline_std for c in curve],
                    marker="x", linestyle="--", capsize=3, color="grey",
                    label="shuffled labels")
    ax.plot(xs, [c.chance for c in curve], linestyle=":", color="black", label="chance")
    if by_layer:
        ax.set_xlabel("layer")
    else:
        ax.set_xticks(xs)
        ax.set_xticklabels([c.hook for c in curve], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(name)
    ax.set_title(f"{name} per hook point ({result.position} token, {result.n_samples} prompts)",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, format=fmt)
    return out


_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def _picture_format(path: str | Path) -> str:
    """The matplotlib format for `path`'s extension; ConfigError for any other."""
    suffix = Path(path).suffix.lower()
    if suffix not in _FORMATS:
        raise ConfigError(f"{str(path)!r}: pictures are written as {', '.join(_FORMATS)} "
                           f"(chosen by the extension), not {suffix or 'no extension'!r}")
    return _FORMATS[suffix]
