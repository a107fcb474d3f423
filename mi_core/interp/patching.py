"""Activation patching: which activations carry the difference between a clean and a
corrupted prompt?

For each (layer, position) — or (layer, head) for the per-head kinds (z, q, k, v, result,
pattern; all positions) — the corrupted prompt is run with that one activation replaced by its
clean value, and a metric of the logits is normalised: 0 = corrupted behaviour, 1 = clean
behaviour (``raw=True``: the metric itself). The patched variants of one layer run as one
batch. :func:`attribution_patching` is the first-order (gradient) approximation of the same
grid: ``grad_corrupted(metric) . (clean - corrupted)``, from one forward and one backward pass
through the public gradient path (``HookSpec.capture_grad``). TransformerLens' own
``patching`` functions (every kind, by position or all positions, raw values) are in
:mod:`mi_core.interp.act_patching`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import attrs
import torch

from mi_core.plugin import (
    Gradients, HookPoint, HookSpec, InterventionError, MIModel, require_points, view,
)
from mi_core.interp._common import (
    MetricError, as_ids, check_layers, norm_position, progress, token_str,
)
from mi_core.interp.describe import describe_patching, model_label, tok

#: patch kind -> hook suffix
PATCH_KINDS = {"resid_pre": "hook_resid_pre", "resid_mid": "hook_resid_mid",
               "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out",
               "mixer_out": "hook_mixer_out",
               "resid_post": "hook_resid_post", "z": "attn.hook_z", "q": "attn.hook_q",
               "k": "attn.hook_k", "v": "attn.hook_v", "result": "attn.hook_result",
               "pattern": "attn.hook_pattern"}
#: per-head kinds: a grid over (layer x head), every position patched
HEAD_KINDS = ("z", "q", "k", "v", "result", "pattern")

Metric = Callable[[torch.Tensor], torch.Tensor]


def logit_diff_metric(correct: int, incorrect: int, position: int = -1) -> Metric:
    """logits [batch, seq, vocab] -> [batch]: logit(correct) - logit(incorrect) at `position`.

    The function carries ``token_ids`` and ``units`` ("logits"), from which the patching
    functions name the metric on their results ("logit(' Paris') − logit(' Rome')"); any
    metric may carry a ``name`` (and ``units``) the same way.
    """
    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, position, correct] - logits[:, position, incorrect]
    metric.token_ids = (int(correct), int(incorrect))  # type: ignore[attr-defined]
    metric.units = "logits"  # type: ignore[attr-defined]
    return metric


def metric_name(model: MIModel, metric: Metric) -> tuple[str | None, str | None]:
    """(name, units) of a metric: its ``name`` attribute, or "logit(a) − logit(b)" for a
    :func:`logit_diff_metric`; (None, None) for an anonymous function."""
    units = getattr(metric, "units", None)
    name = getattr(metric, "name", None)
    ids = getattr(metric, "token_ids", None)
    if name is None and ids is not None:
        a, b = (tok(token_str(model, i)) for i in ids)
        name = f"logit({a}) \u2212 logit({b})"
    return (None if name is None else str(name)), (None if units is None else str(units))


def normalize_metric(value: torch.Tensor | float, clean: float, corrupted: float) -> torch.Tensor:
    """(value - corrupted) / (clean - corrupted); MetricError when clean == corrupted."""
    denom = clean - corrupted
    if abs(denom) < 1e-8:
        raise MetricError(f"the metric is the same on the clean and corrupted prompts "
                          f"({clean:.6g}); it cannot be normalised (choose a metric that "
                          f"differs, e.g. a logit difference between the two answers)")
    v = value.float() if isinstance(value, torch.Tensor) else \
        torch.tensor(value, dtype=torch.float32, device="cpu")
    return (v - corrupted) / denom


@attrs.define
class PatchingResult:
    """A patching grid [layers, positions or heads]: normalised metric (0 corrupted, 1 clean),
    or the metric itself when run with ``raw=True``.

    The sign convention is the one of every effect in :mod:`mi_core.interp.effects`,
    intervened − baseline, where the baseline is the corrupted run and the intervention is the
    patch: ``grid = (patched − corrupted) / (clean − corrupted)``, and :meth:`effect` is the
    same difference in the metric's own units. With :func:`logit_diff_metric` the metric is a
    difference of two logits of one distribution, which equals the difference of their
    log-probabilities, so it is shift-invariant. ``clean_prompt`` / ``corrupted_prompt``
    record the inputs when given as text.
    """

    kind: str
    method: str  # "exact" or "attribution"
    grid: torch.Tensor
    layers: list[int]
    columns: list[str]  # position tokens ("3:' Paris'") or head labels ("H5")
    clean_metric: float
    corrupted_metric: float
    clean_prompt: str | None = None
    corrupted_prompt: str | None = None
    metric_name: str | None = None  # e.g. "logit(' Paris') − logit(' Rome')"
    metric_units: str | None = None  # e.g. "logits"
    model: str | None = None
    normalised: bool = True  # False: run with raw=True, the grid holds the metric itself

    def describe(self) -> str:
        """The patching run in one line: kind, layers, prompts, the metric and its units."""
        return describe_patching(self)

    def effect(self) -> torch.Tensor:
        """[layers, columns] patched − corrupted metric, in the metric's units."""
        if not self.normalised:
            return self.grid - self.corrupted_metric
        return self.grid * (self.clean_metric - self.corrupted_metric)

    def top(self, k: int = 5) -> list[tuple[int, str, float]]:
        """The `k` cells with the largest |value|: (layer, column, value)."""
        flat = self.grid.flatten()
        idx = flat.abs().topk(min(k, flat.numel())).indices
        n = self.grid.shape[1]
        return [(self.layers[int(i) // n], self.columns[int(i) % n], float(flat[i])) for i in idx]

    def to_html(self, path: str | Path, title: str | None = None) -> Path:
        """An interactive page of the grid (hover a cell for its value)."""
        return view("patching")(self, path, title=title)


def _pair(model: MIModel, clean: Any, corrupted: Any) -> tuple[torch.Tensor, torch.Tensor]:
    c, k = as_ids(model, clean), as_ids(model, corrupted)
    if c.shape != k.shape or c.shape[0] != 1:
        raise InterventionError(f"patching needs a clean and a corrupted prompt of the same token "
                                f"length (one each): got shapes {list(c.shape)} and {list(k.shape)}")
    return c, k


def _texts(clean: Any, corrupted: Any) -> tuple[str | None, str | None]:
    return (clean if isinstance(clean, str) else None,
            corrupted if isinstance(corrupted, str) else None)


def _metric_values(metric: Metric, logits: torch.Tensor) -> torch.Tensor:
    v = metric(logits)
    v = v if isinstance(v, torch.Tensor) else torch.as_tensor(v, device=logits.device)
    if v.dim() == 0:
        v = v[None]
    if v.shape != (logits.shape[0],):
        raise MetricError(f"the metric must return one value per batch row ({logits.shape[0]}), "
                          f"got shape {list(v.shape)}")
    return v.float()


def _n_heads(model: MIModel, kind: str) -> int:
    return model.num_kv_heads if kind in ("k", "v") else model.num_heads


def _layer_heads(kind: str, act: torch.Tensor) -> int:
    """Heads of one layer's captured per-head activation (the count can differ per layer:
    fewer KV heads on some layers): pattern [b, heads, q, k], else
    [b, s, heads, d]."""
    return act.shape[1] if kind == "pattern" else act.shape[2]


def _stack_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """Rows of per-layer values as one grid; a layer with fewer heads than the widest gets
    NaN in the columns of heads it does not have."""
    width = max(r.shape[0] for r in rows)
    grid = torch.full((len(rows), width), float("nan"), dtype=rows[0].dtype,
                      device=rows[0].device)
    for i, r in enumerate(rows):
        grid[i, :r.shape[0]] = r
    return grid


def _columns(model: MIModel, kind: str, ids: torch.Tensor, positions: list[int],
             n_heads: int | None = None) -> list[str]:
    if kind in HEAD_KINDS:
        return [f"H{h}" for h in range(n_heads or _n_heads(model, kind))]
    try:
        toks = model.to_str_tokens(ids[0])
    except Exception:
        toks = [str(t) for t in ids[0].tolist()]
    return [f"{p}:{toks[p]!r}" for p in positions]


def _setup(model: MIModel, clean: Any, corrupted: Any, kind: str,
           layers: Sequence[int] | None, positions: Sequence[int] | None
           ) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int], list[HookPoint]]:
    """Shared checks of the patching functions: (clean ids, corrupted ids, layers, positions,
    hook points), each validated (kind, equal token lengths, ranges, points the model has)."""
    if kind not in PATCH_KINDS:
        raise InterventionError(f"unknown patch kind {kind!r}; one of {sorted(PATCH_KINDS)}")
    c_ids, k_ids = _pair(model, clean, corrupted)
    seq = c_ids.shape[1]
    layers = check_layers(layers, model.num_layers)
    pos = [norm_position(p, seq) for p in (positions if positions is not None else range(seq))]
    points = [HookPoint.layer_point(i, PATCH_KINDS[kind]) for i in layers]
    require_points(model, points)
    return c_ids, k_ids, layers, pos, points


def patching_grid(model: MIModel, clean: Any, corrupted: Any, metric: Metric,
                  kind: str = "resid_pre", *, layers: Sequence[int] | None = None,
                  positions: Sequence[int] | None = None, batch_size: int = 64,
                  show_progress: bool | None = None, raw: bool = False) -> PatchingResult:
    """Exact activation patching over (layer x position), or (layer x head) for the per-head
    kinds (z, q, k, v by KV head, result, pattern).

    `metric`: logits [batch, seq, vocab] -> [batch]. `raw`: the grid holds the metric values
    (no normalisation). Raises InterventionError for prompts of different token length,
    MetricError when the metric does not differ between them (normalised grids only).
    """
    c_ids, k_ids, layers, pos, points = _setup(model, clean, corrupted, kind, layers, positions)
    clean_cache = model.forward(c_ids, HookSpec().capture_all(points))
    m_clean = float(_metric_values(metric, clean_cache.output)[0])
    m_corr = float(_metric_values(metric, model.forward(k_ids).output)[0])
    scale = (lambda v: v.float()) if raw else (  # noqa: E731
        lambda v: normalize_metric(v, m_clean, m_corr))
    if not raw:
        normalize_metric(0.0, m_clean, m_corr)  # fail early on a constant metric
    heads = [_layer_heads(kind, clean_cache.require(hp)) for hp in points] \
        if kind in HEAD_KINDS else [0]
    width = max(heads)
    cols_of = (lambda li: list(range(heads[li]))) if kind in HEAD_KINDS else (  # noqa: E731
        lambda li: pos)
    # results live on the CPU; a layer with fewer heads than the widest: NaN beyond its own
    grid = torch.full((len(layers), width if kind in HEAD_KINDS else len(pos)), float("nan"),
                      device="cpu")
    for li, (layer, hp) in enumerate(progress(list(zip(layers, points)), f"patch {kind}",
                                             enabled=show_progress)):
        src = clean_cache.require(hp)
        cols = cols_of(li)
        for start in range(0, len(cols), batch_size):
            chunk = cols[start:start + batch_size]

            def patch(x: torch.Tensor, hook: HookPoint, chunk: list[int] = chunk,
                      src: torch.Tensor = src) -> torch.Tensor:
                x = x.clone()
                for row, col in enumerate(chunk):
                    if kind in HEAD_KINDS and kind != "pattern":  # [b, s, heads, d]
                        x[row, :, col] = src[0, :, col]
                    else:  # [b, s, ...] at a position, or a head's pattern [b, heads, q, k]
                        x[row, col] = src[0, col]
                return x

            out = model.forward(k_ids.expand(len(chunk), -1), HookSpec().intervene(hp, patch)).output
            grid[li, start:start + len(chunk)] = scale(_metric_values(metric, out))
    return PatchingResult(kind, "exact", grid, layers,
                          _columns(model, kind, c_ids, pos, width or None),
                          m_clean, m_corr, *_texts(clean, corrupted),
                          *metric_name(model, metric), model_label(model), not raw)


def attribution_patching(model: MIModel, clean: Any, corrupted: Any, metric: Metric,
                         kind: str = "resid_pre", layers: Sequence[int] | None = None,
                         positions: Sequence[int] | None = None, raw: bool = False
                         ) -> PatchingResult:
    """The linear approximation of :func:`patching_grid` (same grid, same normalisation;
    `raw`: the estimated metric values): ``grad of metric at the corrupted run . (clean -
    corrupted activation)``, the gradients captured through ``HookSpec.capture_grad``.

    Needs a backend whose forward is differentiable (gradients flow through hook points).
    """
    model.require(Gradients, "attribution_patching")
    c_ids, k_ids, layers, pos, points = _setup(model, clean, corrupted, kind, layers, positions)
    clean_cache = model.forward(c_ids, HookSpec().capture_all(points))
    spec = HookSpec().capture_all(points)
    for hp in points:
        spec.capture_grad(hp)
    corr_cache = model.forward(k_ids, spec)
    m_clean = float(_metric_values(metric, clean_cache.output)[0])
    m = _metric_values(metric, corr_cache.output)[0]
    m_corr = float(m.detach())
    m.backward()
    rows = []
    for hp in points:
        diff = (clean_cache.require(hp) - corr_cache.require(hp).detach()).float()
        prod = (corr_cache.grad(hp).float() * diff)[0]
        if kind == "pattern":  # [heads, q, k]
            rows.append(prod.sum((1, 2)))
        elif kind in HEAD_KINDS:  # [seq, heads, d]
            rows.append(prod.sum((0, 2)))
        else:
            rows.append(prod.sum(-1)[pos])
    est = _stack_rows([r.detach().cpu() for r in rows]) + m_corr
    grid = est if raw else normalize_metric(est, m_clean, m_corr)
    return PatchingResult(kind, "attribution", grid, layers,
                          _columns(model, kind, c_ids, pos, est.shape[1]),
                          m_clean, m_corr, *_texts(clean, corrupted),
                          *metric_name(model, metric), model_label(model), not raw)
