"""From a probe to a steering direction in model space, and its dose-response.

Single-prompt dose-response (KL, top token, target probability) is the interp toolkit's
:func:`mi_core.interp.dose_response`; :func:`probe_steering_spec` gives it a probe's
direction. :func:`mean_dose_response` here averages any metric over many prompts.

A probe scores standardised activations: ``logit = sum_j coef_j (x_j - mean_j) / scale_j + b``.
Its gradient with respect to the raw activation x is ``coef / scale``, so that (not ``coef``)
is the model-space direction that moves the probe's logit fastest per unit of norm; the
mean shift cancels out of a direction. Adding ``alpha * u`` (u the unit direction) changes
the probe's logit by ``alpha * |coef / scale|`` at the probed point.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import attrs
import numpy as np
import torch

from mi_core.plugin import progress as progress_of, Add, HookCache, HookLike, HookPoint, HookSpec, MIModel
from mi_probing.errors import ProbingError
from mi_probing.probes import ProbeResult

if TYPE_CHECKING:
    from mi_core.interp import SteeringSpec


def model_space_weights(probe: ProbeResult) -> np.ndarray:
    """coef / scale: the probe's weights on raw activations, [outputs, n_features]."""
    return np.asarray(probe.coef, dtype=float) / np.asarray(probe.scale, dtype=float)


def probe_direction(probe: ProbeResult, target: Any = None) -> torch.Tensor:
    """Unit vector [*feature_shape] (float32) in model space along which the probe's
    evidence for `target` grows fastest.

    Binary: toward ``classes[1]`` by default (``target=classes[0]`` flips it).
    Multiclass: `target` is required; the direction is ``w_target - mean_k w_k`` (softmax is
    unchanged by a shift shared by all classes, so this is the part that favours `target`).
    Regression: toward larger targets.
    """
    w = model_space_weights(probe)
    if probe.task == "regression":
        if target is not None:
            raise ProbingError("a regression probe has one direction; do not pass target")
        vec = w[0]
    elif probe.task == "binary":
        if target is None or target == probe.classes[1]:
            vec = w[0]
        elif target == probe.classes[0]:
            vec = -w[0]
        else:
            raise ProbingError(f"target {target!r} is not a class of the probe at "
                               f"{probe.hook} (classes: {probe.classes})")
    else:
        if target not in probe.classes:
            raise ProbingError(f"a multiclass probe needs target= one of {probe.classes}, "
                               f"got {target!r}")
        vec = w[probe.classes.index(target)] - w.mean(axis=0)
    norm = float(np.linalg.norm(vec))
    if not np.isfinite(norm) or norm == 0.0:
        raise ProbingError(f"probe at {probe.hook} has zero weights; no direction to take")
    return torch.tensor(vec / norm, dtype=torch.float32).reshape(probe.feature_shape)


def steering_hooks(direction: torch.Tensor, hook: HookLike, scale: float,
                   hooks: HookSpec | None = None) -> HookSpec:
    """``Add(scale * direction)`` at `hook` (every position), added to `hooks` or a new spec.

    `direction` [*feature_shape] broadcasts over [batch, seq, *feature_shape].
    """
    spec = hooks if hooks is not None else HookSpec()
    return spec.intervene(HookPoint.parse(hook), Add(float(scale) * direction))


def steer_with_probe(probe: ProbeResult, scale: float, target: Any = None,
                     hooks: HookSpec | None = None) -> HookSpec:
    """Steering spec along `probe`'s direction at the point the probe was trained on."""
    if not probe.hook:
        raise ProbingError("this probe has no hook point; use steering_hooks(direction, hook, ...)")
    return steering_hooks(probe_direction(probe, target), probe.hook, scale, hooks)


def probe_steering_spec(probe: ProbeResult, strength: float = 1.0, target: Any = None,
                        positions: Sequence[int] | None = None) -> "SteeringSpec":
    """A residual :class:`mi_core.interp.SteeringSpec` along `probe`'s direction at its
    layer point (e.g. ``blocks.14.hook_resid_post``), for :func:`mi_core.interp.dose_response`
    and :func:`mi_core.interp.apply_steering`. Needs a per-layer probe on d_model features."""
    from mi_core.interp import SteeringSpec

    hp = HookPoint.parse(probe.hook) if probe.hook else None
    if hp is None or hp.layer is None or len(probe.feature_shape) != 1:
        raise ProbingError(f"residual steering needs a probe at a per-layer point with "
                           f"[d_model] features; this one is at {probe.hook or '?'} with "
                           f"features {probe.feature_shape} (use steering_hooks instead)")
    return SteeringSpec.residual([hp.layer], probe_direction(probe, target), strength,
                                 positions=positions, point=hp.suffix)


#: A response read from one forward pass: (cache, attention_mask [batch, seq]) -> [batch].
Metric = Callable[[HookCache, torch.Tensor], torch.Tensor]


def last_token_logit_diff(pos_token: int, neg_token: int) -> Metric:
    """Metric: logit(pos_token) - logit(neg_token) at each prompt's last real token."""

    def metric(cache: HookCache, mask: torch.Tensor) -> torch.Tensor:
        dev = cache.output.device
        last = (mask.sum(dim=1) - 1).to(dev)
        logits = cache.output[torch.arange(mask.shape[0], device=dev), last]
        return (logits[:, pos_token] - logits[:, neg_token]).float()

    metric.__name__ = f"logit[{pos_token}] - logit[{neg_token}] at last token"
    return metric


@attrs.define
class DoseResponse:
    """Mean (and std over prompts) of a metric for each steering scale."""

    hook: str
    metric: str
    scales: list[float]
    mean: list[float]
    std: list[float]
    n_prompts: int


def mean_dose_response(model: MIModel, texts: Sequence[str], direction: torch.Tensor,
                       hook: HookLike, scales: Sequence[float], metric: Metric,
                       batch_size: int = 16, progress: bool | None = None) -> DoseResponse:
    """Steer with ``Add(scale * direction)`` at `hook` for each scale; average `metric`.

    Prompts are right-padded (see :mod:`mi_probing.collect`); `metric` receives the cache
    and the attention mask and returns one value per prompt.
    """
    if not texts:
        raise ProbingError("mean_dose_response needs at least one prompt")
    hp = HookPoint.parse(hook)
    tok = model.tokenizer
    pad_id = tok.eos_token_id if tok.eos_token_id is not None else 0
    batches = [model.to_tokens_padded(list(texts[i:i + batch_size]), side="right", pad_id=pad_id)
               for i in range(0, len(texts), batch_size)]
    means, stds = [], []
    for scale in progress_of(list(scales), "dose-response", unit="scale", enabled=progress):
        spec = steering_hooks(direction, hp, scale)
        vals = torch.cat([metric(model.forward(ids, spec, attention_mask=mask), mask).cpu()
                          for ids, mask in batches])
        means.append(float(vals.mean()))
        stds.append(float(vals.std(unbiased=False)))
    return DoseResponse(hook=hp.name, metric=getattr(metric, "__name__", "metric"),
                        scales=[float(s) for s in scales], mean=means, std=stds,
                        n_prompts=len(texts))
