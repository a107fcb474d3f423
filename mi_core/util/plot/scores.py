"""Pictures of scores over many heads or prompts: the three head-detection scores side by
side (``mi heads``), and a sweep's aggregate (``mi sweep``) with the knockout effect in
log-probability first and the raw logit change beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mi_core.plugin import ConfigError
from mi_core.util.plot._base import _plt, _shorten, default_title, save_figure

#: what each head score measures
MEANINGS = {"previous_token": "attention to the previous token",
            "duplicate_token": "attention to earlier copies of the token",
            "induction": "attention to the token after an earlier copy"}


def plot_head_scores(result: Any, path: str | Path, title: str | None = None,
                     figsize: tuple[float, float] | None = None) -> Path:
    """A ``HeadDetectionResult``: one layers x heads heatmap per kind (previous-token,
    duplicate-token, induction), on one shared 0..1 scale, the best head of each marked."""
    plt = _plt()
    kinds = list(result.scores)
    if not kinds:
        raise ConfigError("plot_head_scores: the result has no scores")
    grids = [result.scores[k].detach().float().cpu() for k in kinds]
    layers, heads = grids[0].shape
    fig, axes = plt.subplots(1, len(kinds), squeeze=False, sharey=True, figsize=figsize or (
        max(7.0, len(kinds) * (0.34 * heads + 1.4) + 1.4), max(4.0, 0.24 * layers + 2.4)))
    im = None
    for ax, kind, g in zip(axes[0], kinds, grids):
        im = ax.imshow(g.numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto",
                       interpolation="nearest")
        best = int(g.nan_to_num(nan=-1.0).argmax())
        ax.add_patch(plt.Rectangle((best % heads - 0.5, best // heads - 0.5), 1, 1, fill=False,
                                   ec="tab:orange", lw=1.6))
        ax.set_title(f"{kind.replace('_', '-')}\n{MEANINGS.get(kind, '')}\nbest L{best // heads}"
                     f"H{best % heads} {float(g.flatten()[best]):.2f}", fontsize=8)
        ax.set_xticks(range(heads), [str(h) for h in range(heads)], fontsize=6)
        ax.set_xlabel("head")
        step = max(1, layers // 30)
        ax.set_yticks(range(0, layers, step), [str(x) for x in range(0, layers, step)],
                      fontsize=6)
    axes[0][0].set_ylabel("layer")
    fig.colorbar(im, ax=axes[0].tolist(), label="score (attention on the ideal edges)",
                 fraction=0.03, pad=0.02)
    what = getattr(result, "description", None)
    t = default_title("attention head scores", result, title)
    if title is None and what:
        t += f"\nmeasured on {what}"
    fig.suptitle(_shorten(t), fontsize=10)
    return save_figure(fig, path)


def _curve(ax: Any, x: list[float], mean: torch.Tensor, std: torch.Tensor, label: str,
           colour: str) -> None:
    ax.plot(x, mean.numpy(), marker="o", ms=3, color=colour)
    ax.fill_between(x, (mean - std).numpy(), (mean + std).numpy(), alpha=0.25, color=colour,
                    label="\u00b1 1 std over prompts")
    ax.axhline(0, color="#999", lw=0.6)
    ax.set_ylabel(label, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_sweep_aggregate(agg: dict[str, Any], path: str | Path, title: str | None = None,
                         figsize: tuple[float, float] | None = None) -> Path:
    """The aggregate of ``mi sweep`` (``mi_core.scale.analyses.aggregate``): the mean over
    prompts with a +-1 std band per layer / strength, or a layers x heads heatmap of the
    mean. A knockout is shown as the answer's log-probability change in nats first (shift-
    invariant) with the raw logit change beside it, both knocked out - baseline."""
    plt = _plt()
    if not agg.get("n"):
        raise ConfigError("plot_sweep_aggregate: the aggregate holds no results (n = 0)")
    panels = [(agg["metric"], agg["mean"], agg["std"])]
    if agg.get("analysis") == "knockout" and "logprob_mean" in agg:
        panels = [("\u0394 log p(answer), nats (knocked out - baseline)", agg["logprob_mean"],
                   agg["logprob_std"]),
                  ("\u0394 logit(answer), raw (knocked out - baseline)", agg["mean"], agg["std"])]
    mean0 = torch.tensor(panels[0][1], dtype=torch.float64)
    two_d = mean0.dim() == 2
    size = figsize or ((max(5.5, 2.2 + 0.4 * mean0.shape[1]) * len(panels),
                        max(3.0, 1.4 + 0.22 * mean0.shape[0])) if two_d
                       else (5.8 * len(panels), 3.8))
    fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=size)
    x = [float(r) for r in agg["rows"]]
    for ax, (label, mean, std) in zip(axes[0], panels):
        m, s = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
        if two_d:
            lim = float(m.abs().nan_to_num(nan=0.0).max()) or 1.0
            im = ax.imshow(m.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
            ax.set_yticks(range(len(agg["rows"])), [str(r) for r in agg["rows"]], fontsize=6)
            ax.set_xticks(range(len(agg["cols"])), [str(c) for c in agg["cols"]], fontsize=6)
            ax.set_xlabel(agg.get("col_label") or "")
            ax.set_ylabel(agg.get("row_label") or "")
            fig.colorbar(im, ax=ax, label="mean over prompts", fraction=0.05)
            ax.set_title(label, fontsize=8)
        else:
            _curve(ax, x, m, s, label, "tab:blue" if ax is axes[0][0] else "tab:gray")
            ax.set_xlabel(agg.get("row_label") or "")
    head = f"{agg['analysis']} sweep over {agg['n']} prompts"
    if agg.get("model"):
        head += f", {agg['model']}"
    fig.suptitle(_shorten(title or head), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
