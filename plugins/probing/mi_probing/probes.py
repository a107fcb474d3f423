"""Linear probes (scikit-learn) scored against shuffled-label baselines.

Every score comes with the same probe trained and tested on randomly permuted labels
(the shuffled-label control: same inputs, same class balance, no relation to the input),
its analytic chance level and a permutation p-value, so a number is never read alone.
Standardisation lives inside the scikit-learn pipeline, so each fold's scaler sees only
its training rows.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import numpy as np
import torch
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import (
    KFold,
    ShuffleSplit,
    StratifiedKFold,
    StratifiedShuffleSplit,
    cross_validate,
)
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from mi_core.plugin import HookPoint
from mi_probing.errors import ProbingError

TASKS = ("auto", "classification", "regression")

#: Below this many activation values, BLAS runs single-threaded: thread start-up costs
#: more than small probes' matrix products (10x slower measured for 200 x 32 on 2 cores).
SMALL_PROBLEM = 4_000_000

#: scikit-learn scorer per reported metric name, and whether higher is better.
_SCORERS: dict[str, tuple[str, bool]] = {
    "accuracy": ("accuracy", True),
    "balanced_accuracy": ("balanced_accuracy", True),
    "auroc": ("roc_auc", True),  # multiclass: "roc_auc_ovr" (macro one-vs-rest)
    "r2": ("r2", True),
    "mse": ("neg_mean_squared_error", False),  # reported positive, lower is better
}


@attrs.define
class ProbeScore:
    """One metric: the probe's score beside its shuffled-label baseline and chance level.

    ``value``/``std``: mean and std over CV folds (std 0 for a single held-out split).
    ``baseline``/``baseline_std``: mean and std over shuffles of the same procedure on
    permuted labels. ``chance``: the analytic level (majority-class rate for accuracy,
    1/K for balanced accuracy, 0.5 for AUROC, 0 for R², label variance for MSE).
    ``p_value``: (1 + #shuffles scoring at least as well) / (1 + #shuffles).
    """

    metric: str
    value: float
    std: float
    baseline: float | None
    baseline_std: float | None
    chance: float
    p_value: float | None
    higher_is_better: bool = True

    @property
    def selectivity(self) -> float | None:
        """value - baseline (how much the probe beats its shuffled-label control)."""
        return None if self.baseline is None else self.value - self.baseline


@attrs.define
class ProbeResult:
    """A trained linear probe at one hook point, its scores and its weights.

    Weights are from a final fit on all examples, in standardised space:
    ``logits = ((x - mean) / scale) @ coef.T + intercept`` for x [n, n_features]
    (``coef`` [1, F] for binary and regression, [K, F] for K > 2 classes).
    :func:`mi_probing.direction.probe_direction` turns them into a model-space direction.
    """

    hook: str
    layer: int | None
    position: str
    task: str  # "binary" | "multiclass" | "regression"
    n_samples: int
    n_features: int
    feature_shape: list[int]
    classes: list[Any]  # JSON-native labels, sorted; classes[1] is "positive" when binary
    split: str  # e.g. "5-fold CV" or "held-out 25%"
    n_shuffles: int
    regularization: float  # C for logistic regression, alpha for ridge
    standardize: bool
    seed: int
    scores: dict[str, ProbeScore]
    coef: list[list[float]]
    intercept: list[float]
    mean: list[float]
    scale: list[float]
    mean_norm: float  # mean L2 norm of the activations (a natural unit for steering)

    @property
    def primary_metric(self) -> str:
        return "r2" if self.task == "regression" else "accuracy"

    def score(self, metric: str | None = None) -> ProbeScore:
        name = metric or self.primary_metric
        if name not in self.scores:
            raise ProbingError(f"metric {name!r} not computed for this {self.task} probe "
                               f"(have: {', '.join(self.scores)})")
        return self.scores[name]

    def decision_function(self, x: torch.Tensor | np.ndarray) -> np.ndarray:
        """Probe logits (regression: predictions) for activations x [n, F] -> [n, outputs]."""
        arr = _as_2d(x, self.hook)
        if arr.shape[1] != self.n_features:
            raise ProbingError(f"probe at {self.hook} expects {self.n_features} features, "
                               f"got {arr.shape[1]}")
        z = (arr - np.asarray(self.mean)) / np.asarray(self.scale)
        return z @ np.asarray(self.coef).T + np.asarray(self.intercept)


def _as_2d(x: torch.Tensor | np.ndarray, hook: str) -> np.ndarray:
    arr = x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, float)
    if arr.ndim != 2:
        raise ProbingError(f"activations at {hook or '?'} must be [n, features], got "
                           f"shape {list(arr.shape)}")
    if not np.isfinite(arr).all():
        raise ProbingError(f"activations at {hook or '?'} contain NaN or inf")
    return arr


def resolve_task(labels: Sequence[Any], task: str) -> str:
    """'auto' -> regression when labels are numbers with a non-integer, else classification."""
    if task not in TASKS:
        raise ProbingError(f"task must be one of {TASKS}, got {task!r}")
    if task != "auto":
        return task
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in labels)
    frac = any(isinstance(v, float) and not float(v).is_integer() for v in labels)
    return "regression" if numeric and frac else "classification"


def _estimator(regression: bool, reg: float, standardize: bool, max_iter: int) -> Pipeline:
    model = Ridge(alpha=reg) if regression else LogisticRegression(C=reg, max_iter=max_iter)
    return Pipeline([("scale", StandardScaler() if standardize else "passthrough"),
                     ("probe", model)])


def _splitter(regression: bool, cv: int | None, test_size: float | None,
              seed: int) -> tuple[Any, str, int]:
    """(scikit-learn splitter, description, minimum examples per class it needs)."""
    if test_size is not None:
        if not 0.0 < test_size < 1.0:
            raise ProbingError(f"test_size must be in (0, 1), got {test_size}")
        cls = ShuffleSplit if regression else StratifiedShuffleSplit
        return cls(n_splits=1, test_size=test_size, random_state=seed), \
            f"held-out {test_size:.0%}", 2
    k = 5 if cv is None else int(cv)
    if k < 2:
        raise ProbingError(f"cross-validation needs at least 2 folds, got {k}")
    cls = KFold if regression else StratifiedKFold
    return cls(n_splits=k, shuffle=True, random_state=seed), f"{k}-fold CV", k


def _run(est: Pipeline, x: np.ndarray, y: np.ndarray, splitter: Any,
         scoring: dict[str, str]) -> dict[str, np.ndarray]:
    out = cross_validate(est, x, y, cv=splitter, scoring=scoring, error_score="raise")
    return {m: (out[f"test_{m}"] if _SCORERS[m][1] else -out[f"test_{m}"]) for m in scoring}


@attrs.define
class _LabelPlan:
    task: str  # "binary" | "multiclass" | "regression"
    classes: list[Any]
    y: np.ndarray  # class indices, or float targets
    splitter: Any
    split: str
    chance: dict[str, float]  # metric -> analytic chance level (also the metric list)


def check_labels(labels: Sequence[Any], *, task: str = "auto", cv: int | None = None,
                 test_size: float | None = None, seed: int = 0) -> _LabelPlan:
    """Validate labels for a probe before any activation is computed.

    ProbingError for one class only, fewer examples of a class than the split needs,
    constant or non-numeric regression targets, or a bad split setting.
    """
    labels = list(labels)
    regression = resolve_task(labels, task) == "regression"
    if regression:
        try:
            y = np.asarray(labels, dtype=float)
        except (TypeError, ValueError):
            raise ProbingError("regression needs numeric labels") from None
        if np.ptp(y) == 0:
            raise ProbingError(f"all {len(y)} regression targets equal {y[0]}; nothing to fit")
        splitter, split, need = _splitter(True, cv, test_size, seed)
        if len(y) < max(need, 4):
            raise ProbingError(f"{split} of a regression probe needs more than {len(y)} "
                               "examples")
        return _LabelPlan("regression", [], y, splitter, split,
                          {"r2": 0.0, "mse": float(np.var(y))})
    classes = sorted(set(labels), key=lambda v: (str(type(v)), v))
    if len(classes) < 2:
        raise ProbingError(f"all {len(labels)} examples have the label {classes[0]!r}; "
                           "a classifier needs at least two classes")
    index = {c: i for i, c in enumerate(classes)}
    y = np.asarray([index[v] for v in labels])
    counts = np.bincount(y, minlength=len(classes))
    splitter, split, need = _splitter(False, cv, test_size, seed)
    if counts.min() < need:
        few = {str(classes[i]): int(c) for i, c in enumerate(counts) if c < need}
        raise ProbingError(f"{split} needs at least {need} examples of every class; "
                           f"too few: {few}")
    return _LabelPlan("binary" if len(classes) == 2 else "multiclass", classes, y, splitter,
                      split, {"accuracy": float(counts.max() / counts.sum()),
                              "balanced_accuracy": 1.0 / len(classes), "auroc": 0.5})


def fit_probe(x: torch.Tensor | np.ndarray, labels: Sequence[Any], *, hook: str = "",
              position: str = "last", task: str = "auto", cv: int | None = None,
              test_size: float | None = None, regularization: float = 1.0,
              standardize: bool = True, n_shuffles: int = 5, seed: int = 0,
              feature_shape: Sequence[int] | None = None, max_iter: int = 2000) -> ProbeResult:
    """Train and score a linear probe on activations x [n, F] with one label per row.

    Classification (logistic regression, L2 with inverse strength `regularization` = C;
    binary or multinomial) or regression (ridge, `regularization` = alpha). Scored by
    `cv`-fold cross-validation (default 5) or one held-out split of `test_size`, stratified
    for classification; every metric beside the mean of `n_shuffles` shuffled-label runs.
    """
    arr = _as_2d(x, hook)
    labels = list(labels)
    if len(labels) != arr.shape[0]:
        raise ProbingError(f"{arr.shape[0]} activation rows at {hook or '?'} but "
                           f"{len(labels)} labels")
    if not regularization > 0:
        raise ProbingError(f"regularization (C or alpha) must be > 0, got {regularization}")
    if n_shuffles < 0:
        raise ProbingError(f"n_shuffles must be >= 0, got {n_shuffles}")
    plan = check_labels(labels, task=task, cv=cv, test_size=test_size, seed=seed)
    y, splitter = plan.y, plan.splitter
    scoring = {m: _SCORERS[m][0] for m in plan.chance}
    if plan.task == "multiclass":
        scoring["auroc"] = "roc_auc_ovr"
    est = _estimator(plan.task == "regression", regularization, standardize, max_iter)
    rng = np.random.default_rng(seed)
    with threadpool_limits(limits=1 if arr.size < SMALL_PROBLEM else None):
        real = _run(est, arr, y, splitter, scoring)
        shuffled = [_run(est, arr, rng.permutation(y), splitter, scoring)
                    for _ in range(n_shuffles)]
        est.fit(arr, y)  # the final probe, on every example: its weights are the direction

    scores: dict[str, ProbeScore] = {}
    for m, chance in plan.chance.items():
        value, higher = float(np.mean(real[m])), _SCORERS[m][1]
        base = np.array([float(np.mean(s[m])) for s in shuffled])
        beats = (base >= value) if higher else (base <= value)
        have = n_shuffles > 0
        scores[m] = ProbeScore(
            metric=m, value=value, std=float(np.std(real[m])),
            baseline=float(base.mean()) if have else None,
            baseline_std=float(base.std()) if have else None, chance=chance,
            p_value=float((1 + beats.sum()) / (1 + n_shuffles)) if have else None,
            higher_is_better=higher)

    lin = est.named_steps["probe"]
    scaler = est.named_steps["scale"]
    coef = np.atleast_2d(lin.coef_)
    mean = scaler.mean_ if standardize else np.zeros(arr.shape[1])
    scale = scaler.scale_ if standardize else np.ones(arr.shape[1])
    hp = HookPoint.parse(hook) if hook else None
    return ProbeResult(
        hook=hp.name if hp else "", layer=hp.layer if hp else None, position=position,
        task=plan.task, n_samples=int(arr.shape[0]), n_features=int(arr.shape[1]),
        feature_shape=list(feature_shape) if feature_shape is not None else [arr.shape[1]],
        classes=plan.classes, split=plan.split, n_shuffles=n_shuffles, regularization=regularization,
        standardize=standardize, seed=seed, scores=scores, coef=coef.tolist(),
        intercept=np.atleast_1d(lin.intercept_).astype(float).tolist(),
        mean=np.asarray(mean, float).tolist(), scale=np.asarray(scale, float).tolist(),
        mean_norm=float(np.linalg.norm(arr, axis=1).mean()))
