"""Probe many hook points (typically one per layer) and the metric-vs-layer curve."""

from __future__ import annotations

import fnmatch
import os
from typing import Any, Iterable, Sequence

import attrs

from mi_core.plugin import progress as progress_of, HookError, HookLike, HookPoint, MIModel
from mi_probing.collect import ActivationSet, collect_activations
from mi_probing.data import LabelledDataset
from mi_probing.errors import ProbingError
from mi_probing.probes import ProbeResult, check_labels, fit_probe


@attrs.define
class CurvePoint:
    """One hook point's score for the sweep's metric, beside its baseline and chance."""

    hook: str
    layer: int | None
    value: float
    std: float
    baseline: float | None
    baseline_std: float | None
    chance: float
    p_value: float | None


@attrs.define
class SweepResult:
    """Probes at several hook points on one dataset; ``curve`` is ``metric`` per point."""

    model: str
    data: str
    position: str
    task: str
    metric: str
    n_samples: int
    classes: list[Any]
    probes: list[ProbeResult]
    curve: list[CurvePoint]

    def best(self) -> ProbeResult:
        """The probe with the best `metric` (ties: the earliest point)."""
        sign = 1.0 if self.probes[0].score(self.metric).higher_is_better else -1.0
        return max(self.probes, key=lambda p: sign * p.score(self.metric).value)

    def probe(self, hook: HookLike) -> ProbeResult:
        name = HookPoint.parse(hook).name
        for p in self.probes:
            if p.hook == name:
                return p
        raise HookError(f"hook point {name!r} was not probed "
                        f"(probed: {', '.join(p.hook for p in self.probes)})")


def make_curve(probes: Sequence[ProbeResult], metric: str) -> list[CurvePoint]:
    out = []
    for p in probes:
        s = p.score(metric)
        out.append(CurvePoint(p.hook, p.layer, s.value, s.std, s.baseline, s.baseline_std,
                              s.chance, s.p_value))
    return out


def layer_hooks(model: MIModel, suffix: str = "hook_resid_post",
                layers: Iterable[int] | None = None) -> list[str]:
    """``blocks.{i}.{suffix}`` for `layers` (default: every layer)."""
    chosen = range(model.num_layers) if layers is None else layers
    return [HookPoint.layer_point(i, suffix).name for i in chosen]


def expand_hooks(model: MIModel, patterns: Iterable[str]) -> list[str]:
    """Names, with shell wildcards (``blocks.*.hook_resid_post``) expanded over the model's
    points in execution order. A pattern matching nothing is a HookError."""
    names = [p.name for p in model.hook_points()]
    out: list[str] = []
    for pat in patterns:
        if any(ch in pat for ch in "*?["):
            hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
            if not hits:
                raise HookError(f"hook pattern {pat!r} matches no hook point of this model")
            out += hits
        else:
            out.append(HookPoint.parse(pat).name)
    return list(dict.fromkeys(out))


def probe_activations(acts: ActivationSet, labels: Sequence[Any], *, model_name: str = "",
                      data: str = "", progress: bool | None = None,
                      **probe_kwargs: Any) -> SweepResult:
    """One :func:`fit_probe` per collected hook point (one hook's rows in memory at a time).

    `probe_kwargs` go to :func:`mi_probing.probes.fit_probe` (task, cv, test_size,
    regularization, standardize, n_shuffles, seed).
    """
    if len(labels) != acts.n:
        raise ProbingError(f"{acts.n} prompts but {len(labels)} labels")
    probes = [fit_probe(acts.get(h), labels, hook=h, position=str(acts.position),
                        feature_shape=acts.feature_shapes[h], **probe_kwargs)
              for h in progress_of(acts.hooks, "fitting probes", unit="hook", enabled=progress)]
    first = probes[0]
    return SweepResult(model=model_name, data=data, position=str(acts.position),
                       task=first.task, metric=first.primary_metric, n_samples=acts.n,
                       classes=first.classes, probes=probes,
                       curve=make_curve(probes, first.primary_metric))


def probe_model(model: MIModel, dataset: LabelledDataset, hooks: Iterable[HookLike], *,
                position: "str | int" = "last", batch_size: int = 16,
                out_dir: str | os.PathLike[str] | None = None, progress: bool | None = None,
                **probe_kwargs: Any) -> SweepResult:
    """Collect activations of `dataset` at `hooks` in one pass, then probe each point.

    Labels are checked (:func:`check_dataset`) before the model runs, so bad data fails
    fast.
    """
    hooks = list(hooks)
    check_dataset(dataset, **{k: v for k, v in probe_kwargs.items()
                              if k in ("task", "cv", "test_size")})
    acts = collect_activations(model, dataset.texts, hooks, position=position,
                               batch_size=batch_size, out_dir=out_dir, progress=progress)
    return probe_activations(acts, list(dataset.labels), model_name=model.source,
                             data=dataset.source, progress=progress, **probe_kwargs)


def check_dataset(dataset: LabelledDataset, task: str = "auto", cv: int | None = None,
                  test_size: float | None = None) -> None:
    """:func:`mi_probing.probes.check_labels` with the dataset's source in the message."""
    try:
        check_labels(dataset.labels, task=task, cv=cv, test_size=test_size)
    except ProbingError as exc:
        raise ProbingError(f"{dataset.source}: {exc}") from None
