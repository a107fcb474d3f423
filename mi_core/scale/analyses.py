"""The built-in analyses of ``mi sweep`` as sweep functions (one job per prompt), their
aggregates over prompts (mean and spread per layer / head / strength) and the picture.

A job is ``{"index", "prompt", "answer", "incorrect", "corrupt", "analysis", "params"}``
(``answer`` etc. may be None where the analysis does not need them). The functions are
module-level so the ``processes`` and ``ray`` executors can ship them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from mi_core.plugin import ConfigError, HookPoint, HookSpec, Knockout
from mi_core.interp._common import check_heads, check_layers, resolve_token
from mi_core.interp.knockout import create_knockout_mask, kl_rows, KnockoutSpec

ANALYSES = ("knockout", "patching", "logit-lens", "steering")
#: job fields each analysis requires beyond "prompt"
REQUIRED = {"knockout": (), "logit-lens": (), "steering": (),
            "patching": ("corrupt", "answer", "incorrect")}


def _answer(model: Any, job: dict[str, Any], logits: torch.Tensor) -> int:
    """The answer token: the job's (a single token), else the baseline's top-1."""
    if job.get("answer") is not None:
        return resolve_token(model, job["answer"])
    return int(logits.argmax())


def _nan_to_zero(x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
    return torch.nan_to_num(x, nan=0.0)  # a query with every key removed attends to nothing


def knockout_job(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Knock out the last token's attention to earlier positions (``params.to``: list of
    positions, default all earlier ones), one layer (or one head of one layer with
    ``params.per_head``) at a time; measure the answer's logit and log-probability change (knocked out − baseline, the
    one sign convention of every effect) and the KL divergence.

    The conditions of one prompt run as batched forwards: row r carries the mask of
    condition r at its layer and zeros elsewhere.
    """
    p = job.get("params") or {}
    ids = model.to_tokens(job["prompt"])
    seq = ids.shape[1]
    base = model.forward(ids).output[0, -1].float()
    ans = _answer(model, job, base)
    layers = check_layers(p.get("layers"), model.num_layers)
    heads = check_heads(None, model.num_heads) if p.get("per_head") else [None]
    conds = [(layer, h) for layer in layers for h in heads]
    to = p.get("to") or (list(range(seq - 1)) or [0])
    masks = {h: create_knockout_mask(KnockoutSpec(heads=None if h is None else [h],
                                                  from_positions=[-1], to_positions=to),
                                     model.num_heads, seq, model.device, model.dtype)
             for h in heads}
    chunk = int(p.get("batch", 32))
    diffs, lp_diffs, kls = [], [], []
    base_lp = torch.log_softmax(base, -1)[ans]
    for a in range(0, len(conds), chunk):
        part = conds[a:a + chunk]
        hooks = HookSpec()
        for layer in sorted({c[0] for c in part}):
            m = torch.zeros(len(part), model.num_heads, seq, seq, dtype=model.dtype,
                            device=model.device)
            for r, (cl, h) in enumerate(part):
                if cl == layer:
                    m[r] = masks[h][0]
            hooks.intervene(HookPoint.attn_scores(layer), Knockout(m))
            hooks.intervene(HookPoint.attn_pattern(layer), _nan_to_zero)
        out = model.forward(ids.expand(len(part), -1), hooks).output[:, -1].float()
        diffs += (out[:, ans] - base[ans]).tolist()
        lp_diffs += (torch.log_softmax(out, -1)[:, ans] - base_lp).tolist()
        kls += kl_rows(base.expand_as(out), out).tolist()
    shape = (len(layers), len(heads))
    return {"answer_id": ans, "baseline_logit": float(base[ans]),
            "baseline_prob": float(torch.softmax(base, -1)[ans]), "layers": layers,
            "heads": None if heads == [None] else heads,
            "logit_diff": _grid(diffs, shape, heads == [None]),
            "logprob_diff": _grid(lp_diffs, shape, heads == [None]),
            "kl": _grid(kls, shape, heads == [None])}


def _grid(values: list[float], shape: tuple[int, int], flat: bool) -> list[Any]:
    """[layers] (`flat`) or [layers][heads] from the row-major `values`."""
    rows = [values[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])]
    return [r[0] for r in rows] if flat else rows


def logit_lens_job(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Probability and rank of the answer token after each layer at the last position."""
    from mi_core.interp.logit_lens import LogitLensAnalysis

    p = job.get("params") or {}
    ids = model.to_tokens(job["prompt"])
    ans = _answer(model, job, model.forward(ids).output[0, -1])
    r = LogitLensAnalysis(k=1, layers=p.get("layers"), targets=[ans]).run(model, ids)
    return {"answer_id": ans, "layers": [pt.layer for pt in r.points],
            "prob": [pt.targets[0].prob for pt in r.points],
            "rank": [pt.targets[0].rank for pt in r.points],
            "top1": [pt.top[0].token for pt in r.points]}


def patching_job(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Exact activation patching clean -> corrupt with the logit difference answer -
    incorrect as the metric (normalised: 1 = clean behaviour)."""
    from mi_core.interp.patching import logit_diff_metric, patching_grid

    p = job.get("params") or {}
    metric = logit_diff_metric(resolve_token(model, job["answer"]),
                               resolve_token(model, job["incorrect"]))
    r = patching_grid(model, job["prompt"], job["corrupt"], metric, kind=p.get("kind", "z"),
                      layers=p.get("layers"), show_progress=False)
    return {"kind": r.kind, "layers": r.layers, "columns": r.columns, "grid": r.grid.tolist(),
            "clean_metric": r.clean_metric, "corrupted_metric": r.corrupted_metric}


def steering_job(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Attention steering of the last token towards ``params.to`` (default position 0) in
    ``params.layers``, over ``params.strengths``: KL and the answer's probability."""
    from mi_core.interp.steering import SteeringSpec, dose_response

    p = job.get("params") or {}
    ids = model.to_tokens(job["prompt"])
    ans = _answer(model, job, model.forward(ids).output[0, -1])
    spec = SteeringSpec.attention(check_layers(p.get("layers"), model.num_layers),
                                  p.get("to") or [0], [-1], p.get("heads"))
    strengths = p.get("strengths") or [0.0, 0.5, 1.0, 2.0, 4.0]
    c = dose_response(model, ids, spec, strengths, target=ans, show_progress=False)
    return {"answer_id": ans, "strengths": c.strengths(), "kl": c.kls(),
            "prob": c.target_probs(), "baseline_prob": c.baseline_prob}


JOB_FNS: dict[str, Callable[[Any, dict[str, Any]], dict[str, Any]]] = {
    "knockout": knockout_job, "logit-lens": logit_lens_job, "patching": patching_job,
    "steering": steering_job,
}


def hooks_needed(analysis: str, num_layers: int | None = None,
                 layers: Sequence[int] | None = None) -> list[str]:
    """Hook points of layer 0 (or of `layers`) an analysis needs, checked up front."""
    ls = list(layers) if layers else [0]
    if analysis in ("knockout",):
        return [str(HookPoint.attn_scores(i)) for i in ls] + [str(HookPoint.attn_pattern(i)) for i in ls]
    if analysis == "steering":
        return [str(HookPoint.attn_pattern(i)) for i in ls]
    if analysis == "logit-lens":
        return [str(HookPoint.resid_post(i)) for i in ls]
    return []


# -- aggregates -------------------------------------------------------------------------------

def _mean_std(rows: list[list[float]]) -> tuple[list[float], list[float]]:
    t = torch.tensor(rows, dtype=torch.float64)
    std = t.std(0, unbiased=True) if t.shape[0] > 1 else torch.zeros_like(t[0])
    return t.mean(0).tolist(), std.tolist()


def aggregate(analysis: str, results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and spread (sample std) over prompts of each analysis' main metric:
    knockout: answer logit change (knocked out − baseline) per layer (x head), and the
    log-prob change and KL beside it; logit-lens: answer probability (and rank)
    per layer; patching: normalised metric per (layer, head) for kind z, per layer at the
    last position otherwise; steering: answer probability (and KL) per strength."""
    if not results:
        return {"analysis": analysis, "n": 0}
    r0 = results[0]
    out: dict[str, Any] = {"analysis": analysis, "n": len(results)}
    if analysis == "knockout":
        out.update(metric="answer logit change (knocked out - baseline)", rows=r0["layers"],
                   row_label="layer", cols=r0["heads"], col_label="head" if r0["heads"] else None)
        out["mean"], out["std"] = _mean_std([r["logit_diff"] for r in results])
        if all("logprob_diff" in r for r in results):
            out["logprob_mean"], out["logprob_std"] = _mean_std([r["logprob_diff"] for r in results])
        out["kl_mean"], out["kl_std"] = _mean_std([r["kl"] for r in results])
    elif analysis == "logit-lens":
        out.update(metric="answer probability", rows=r0["layers"], row_label="layer", cols=None)
        out["mean"], out["std"] = _mean_std([r["prob"] for r in results])
        out["rank_mean"], out["rank_std"] = _mean_std([[float(x) for x in r["rank"]] for r in results])
        out["top1_fraction"] = torch.tensor([[x == 0 for x in r["rank"]] for r in results],
                                            dtype=torch.float64).mean(0).tolist()
    elif analysis == "patching":
        out.update(metric="normalised logit difference (1 = clean)", rows=r0["layers"],
                   row_label="layer")
        if r0["kind"] == "z":
            out.update(cols=list(range(len(r0["columns"]))), col_label="head")
            out["mean"], out["std"] = _mean_std([r["grid"] for r in results])
        else:
            out.update(cols=None, position="last")
            out["mean"], out["std"] = _mean_std([[row[-1] for row in r["grid"]] for r in results])
    elif analysis == "steering":
        out.update(metric="answer probability", rows=r0["strengths"], row_label="strength",
                   cols=None)
        out["mean"], out["std"] = _mean_std([r["prob"] for r in results])
        out["kl_mean"], out["kl_std"] = _mean_std([r["kl"] for r in results])
    else:
        raise ConfigError(f"unknown analysis {analysis!r}; one of {', '.join(ANALYSES)}")
    return out


def plot_aggregate(agg: dict[str, Any], path: str | Path, title: str | None = None) -> Path:
    """The aggregate as a PNG: a mean curve with a +-1 std band (one value per row), or a
    heatmap of the mean (rows x heads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    mean = torch.tensor(agg["mean"], dtype=torch.float64)
    std = torch.tensor(agg["std"], dtype=torch.float64)
    title = title or f"{agg['analysis']}: {agg['metric']} (n={agg['n']})"
    if mean.dim() == 2:
        fig, ax = plt.subplots(figsize=(max(6.0, 2.5 + 0.45 * mean.shape[1]),
                                        max(2.5, 1.2 + 0.25 * mean.shape[0])))
        lim = float(mean.abs().max()) or 1.0
        im = ax.imshow(mean.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set_yticks(range(len(agg["rows"])), [str(r) for r in agg["rows"]], fontsize=6)
        ax.set_xticks(range(len(agg["cols"])), [str(c) for c in agg["cols"]], fontsize=6)
        ax.set_xlabel(agg.get("col_label") or "")
        fig.colorbar(im, ax=ax, label="mean over prompts")
    else:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        x = [float(r) for r in agg["rows"]]
        ax.plot(x, mean.numpy(), marker="o", ms=3)
        ax.fill_between(x, (mean - std).numpy(), (mean + std).numpy(), alpha=0.25,
                        label="± 1 std over prompts")
        ax.set_ylabel(agg["metric"])
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    ax.set_ylabel(agg.get("row_label") or "") if mean.dim() == 2 else ax.set_xlabel(agg["row_label"])
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
