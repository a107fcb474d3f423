"""Steering: change attention (post-softmax, renormalised) or add a direction to the residual
stream, measure the effect, and sweep the strength (dose-response).

Attention steering uses :class:`mi_core.Steer` at ``blocks.{i}.attn.hook_pattern``: the
selected edges (query -> key) are multiplied by ``scale`` (or set to ``value``) and each row
is renormalised to sum to 1. Residual steering uses :class:`mi_core.Add` of
``strength * direction`` at a residual point (default ``hook_resid_pre``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Sequence

import attrs
import torch

from mi_core.plugin import (
    Add, HookPoint, HookSpec, InterventionError, MIModel, Steer, require_points, view,
)
from mi_core.interp._common import (
    as_ids, check_heads, check_layers, norm_position, norm_positions, progress, resolve_token,
    token_str,
)
from mi_core.interp.describe import describe_steering, model_label, position, str_tokens
from mi_core.interp.effects import (
    EffectSummary, TokenEffect, effect_summary, kl_divergence, token_effects,
)
from mi_core.interp.knockout import _prompt_text


def _tuple(v: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if v is None else tuple(int(x) for x in v)


@attrs.define
class SteeringSpec:
    """One steering intervention. Build with :meth:`attention` or :meth:`residual`.

    kind "attention": ``layers`` x ``heads`` (None = all), edges ``from_positions`` (queries,
    None = all) x ``to_positions`` (keys); ``scale`` multiplies them or ``value`` sets them.
    kind "residual": ``direction`` [d_model] times ``strength`` added at ``point`` (a layer
    suffix, e.g. "hook_resid_pre") of each layer in ``layers``, at ``from_positions``
    (None = all positions).
    """

    kind: str
    layers: tuple[int, ...] = attrs.field(converter=lambda v: tuple(int(x) for x in v))
    heads: tuple[int, ...] | None = attrs.field(default=None, converter=_tuple)
    from_positions: tuple[int, ...] | None = attrs.field(default=None, converter=_tuple)
    to_positions: tuple[int, ...] | None = attrs.field(default=None, converter=_tuple)
    scale: float = 1.0
    value: float | None = None
    direction: torch.Tensor | None = None
    strength: float = 1.0
    point: str = "hook_resid_pre"

    @classmethod
    def attention(cls, layers: Sequence[int], to_positions: Sequence[int],
                  from_positions: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                  scale: float = 1.0, value: float | None = None) -> "SteeringSpec":
        return cls("attention", layers, heads, from_positions, to_positions, scale, value)

    @classmethod
    def residual(cls, layers: Sequence[int], direction: torch.Tensor, strength: float = 1.0,
                 positions: Sequence[int] | None = None, point: str = "hook_resid_pre"
                 ) -> "SteeringSpec":
        return cls("residual", layers, None, positions, None, direction=direction,
                   strength=strength, point=point)

    def describe(self, tokens: Sequence[str] | None = None, sweep: bool = False) -> str:
        """One line, never the direction's values: "add 4 × direction (576-d, ‖v‖ = 3.2)
        to blocks.6.hook_resid_pre at position 3 ' France'" (`tokens`: the prompt's)."""
        return describe_steering(self, tokens, sweep)

    def with_strength(self, s: float) -> "SteeringSpec":
        """The same spec at dose `s`: residual strength, or attention scale (value if set)."""
        if self.kind == "residual":
            return attrs.evolve(self, strength=s)
        if self.value is not None:
            return attrs.evolve(self, value=s)
        return attrs.evolve(self, scale=s)


def steering_hooks(model: MIModel, spec: SteeringSpec, seq_len: int,
                   hooks: HookSpec | None = None) -> HookSpec:
    """The HookSpec applying `spec` to a prompt of `seq_len` tokens."""
    layers = check_layers(spec.layers, model.num_layers)
    hooks = hooks if hooks is not None else HookSpec()
    if spec.kind == "attention":
        points = [HookPoint.attn_pattern(i) for i in layers]
        require_points(model, points)
        heads = check_heads(spec.heads, model.num_heads)
        if spec.to_positions is None:
            raise InterventionError("attention steering needs to_positions (the keys)")
        qs = norm_positions(spec.from_positions, seq_len, "query position")
        ks = norm_positions(spec.to_positions, seq_len, "key position")
        mask = torch.zeros(1, model.num_heads, seq_len, seq_len, dtype=torch.bool)
        sel = torch.zeros(seq_len, seq_len, dtype=torch.bool)
        sel[torch.tensor(qs)[:, None], torch.tensor(ks)[None, :]] = True
        sel &= torch.ones(seq_len, seq_len, dtype=torch.bool).tril()  # never create future edges
        mask[0, heads] = sel
        for hp in points:
            hooks.intervene(hp, Steer(mask.to(model.device), scale=spec.scale, value=spec.value))
        return hooks
    if spec.kind == "residual":
        if spec.direction is None:
            raise InterventionError("residual steering needs a direction [d_model]")
        d = spec.direction.reshape(-1)
        if d.shape[0] != model.hidden_size:
            raise InterventionError(f"steering direction has {d.shape[0]} elements, the model's "
                                    f"d_model is {model.hidden_size}")
        points = [HookPoint.layer_point(i, spec.point) for i in layers]
        require_points(model, points)
        vec = torch.zeros(1, seq_len, model.hidden_size, dtype=torch.float32,
                          device=model.device)
        ps = norm_positions(spec.from_positions, seq_len, "position")
        vec[0, ps] = spec.strength * d.float().to(model.device)
        for hp in points:
            hooks.intervene(hp, Add(vec))
        return hooks
    raise InterventionError(f"unknown steering kind {spec.kind!r} (attention or residual)")


@attrs.define
class SteeringResult:
    """Baseline vs steered next-token logits [vocab] at ``position``, with the attention the
    query rows pay to the target keys (mean over steered layers/heads) when measured.

    Every difference is **steered − baseline** (see :mod:`mi_core.interp.effects`). The
    logits are raw fields: ``to_json(result, raw=False)`` writes them as null and keeps
    ``spec``, ``prompt`` and the attention values; :meth:`summary` gives KL and top changes.
    """

    RAW_FIELDS: ClassVar[tuple[str, ...]] = ("baseline_logits", "steered_logits")

    baseline_logits: torch.Tensor
    steered_logits: torch.Tensor
    position: int
    baseline_attention: float | None = None
    steered_attention: float | None = None
    spec: SteeringSpec | None = None
    prompt: str | None = None
    prompt_tokens: list[str] | None = None
    model: str | None = None

    def describe(self) -> str:
        """What was steered and where it is measured, in one line (for titles)."""
        return (f"{describe_steering(self.spec, self.prompt_tokens)}; effect = steered "
                f"\u2212 baseline, next token after {position(self.position, self.prompt_tokens)}")

    def kl_divergence(self) -> float:
        """KL(baseline || steered) in nats."""
        return kl_divergence(self.baseline_logits, self.steered_logits)

    def effect(self, token: int) -> TokenEffect:
        """Probability, log-probability and logit change of `token` (steered − baseline)."""
        return token_effects(self.baseline_logits, self.steered_logits, [int(token)],
                             lambda i: f"<{i}>")[0]

    def logit_diff(self, token: int) -> float:
        """steered − baseline raw logit of `token`."""
        return float(self.steered_logits[token] - self.baseline_logits[token])

    def logprob_diff(self, token: int) -> float:
        """steered − baseline log-probability of `token` in nats (shift-invariant)."""
        return self.effect(token).logprob_diff

    def prob_diff(self, token: int) -> float:
        """steered − baseline probability of `token`."""
        return self.effect(token).prob_diff

    def summary(self, k: int = 10) -> EffectSummary:
        """KL, the top-1 tokens of both runs and the `k` most changed tokens."""
        return effect_summary(self.baseline_logits, self.steered_logits, lambda i: f"<{i}>", k)

    def prob(self, token: int, steered: bool = True) -> float:
        lg = self.steered_logits if steered else self.baseline_logits
        return float(torch.softmax(lg.float(), -1)[token])

    def top_token(self, steered: bool = True) -> int:
        return int((self.steered_logits if steered else self.baseline_logits).argmax())

    def to_html(self, path: str | Path, token_names: Any = None, title: str | None = None
                ) -> Path:
        """An interactive page: baseline vs steered next-token probabilities (steered −
        baseline). `token_names`: id -> text, a dict or e.g. ``lambda i: model.to_string([i])``."""
        return view("steering")(self, path, title=title, token_names=token_names)


def _attention_to_targets(model: MIModel, cache: Any, spec: SteeringSpec, seq: int) -> float:
    heads = check_heads(spec.heads, model.num_heads)
    qs = norm_positions(spec.from_positions, seq, "query position")
    ks = norm_positions(spec.to_positions, seq, "key position")
    vals = []
    for i in check_layers(spec.layers, model.num_layers):
        pat = cache.require(HookPoint.attn_pattern(i))[0].float()  # [heads, q, k]
        vals.append(pat[heads][:, qs][:, :, ks].sum(-1).mean())
    return float(torch.stack(vals).mean())


def _baseline(model: MIModel, ids: torch.Tensor, spec: SteeringSpec) -> tuple[Any, HookSpec]:
    cap = HookSpec()
    if spec.kind == "attention":
        cap.capture_all(HookPoint.attn_pattern(i) for i in check_layers(spec.layers, model.num_layers))
    return model.forward(ids, cap), cap


def _steer(model: MIModel, ids: torch.Tensor, spec: SteeringSpec, p: int, base: Any,
           cap: HookSpec) -> SteeringResult:
    seq = ids.shape[1]
    steered = model.forward(ids, steering_hooks(model, spec, seq, cap.copy()))
    res = SteeringResult(base.output[0, p].float().cpu(), steered.output[0, p].float().cpu(), p,
                         spec=spec)
    if spec.kind == "attention":
        res.baseline_attention = _attention_to_targets(model, base, spec, seq)
        res.steered_attention = _attention_to_targets(model, steered, spec, seq)
    return res


def apply_steering(model: MIModel, prompt: Any, spec: SteeringSpec, position: int = -1
                   ) -> SteeringResult:
    """Run `prompt` with and without `spec`; for attention steering also measure the
    attention mass the query rows put on the target keys (mean over layers and heads)."""
    ids = as_ids(model, prompt)
    p = norm_position(position, ids.shape[1])
    steering_hooks(model, spec, ids.shape[1])  # validate before any compute
    base, cap = _baseline(model, ids, spec)
    res = _steer(model, ids, spec, p, base, cap)
    res.prompt = _prompt_text(prompt)
    res.prompt_tokens, res.model = str_tokens(model, ids), model_label(model)
    return res


@attrs.define
class SteeringCalibration:
    """The unsteered attention from the query rows to the target keys, per layer (mean over
    heads), so doses can be given as multiples of what the model does on its own."""

    layers: list[int]
    attention: list[float]
    mean_attention: float

    @classmethod
    def measure(cls, model: MIModel, prompt: Any, spec: SteeringSpec) -> "SteeringCalibration":
        ids = as_ids(model, prompt)
        layers = check_layers(spec.layers, model.num_layers)
        require_points(model, [HookPoint.attn_pattern(i) for i in layers])
        cache = model.forward(ids, HookSpec().capture_all(HookPoint.attn_pattern(i) for i in layers))
        per = [_attention_to_targets(model, cache, attrs.evolve(spec, layers=(i,)), ids.shape[1])
               for i in layers]
        return cls(layers, per, float(sum(per) / len(per)))

    def value_for_multiple(self, k: float) -> float:
        """The post-softmax value that sets each target edge to `k` x the baseline mean."""
        return k * self.mean_attention


@attrs.define
class DoseResponsePoint:
    """One strength of a sweep. Differences are steered − baseline: ``target_prob_diff``,
    ``target_logprob_diff`` (nats, shift-invariant) and the raw ``target_logit_diff``."""

    strength: float
    kl_divergence: float
    top_token: int
    target_prob: float | None = None
    target_logit_diff: float | None = None
    steered_attention: float | None = None
    top_token_str: str | None = None
    target_prob_diff: float | None = None
    target_logprob_diff: float | None = None


@attrs.define
class DoseResponseCurve:
    """The effect of one steering spec over a sweep of strengths (see :func:`dose_response`).

    ``spec`` is the swept spec (its own strength is replaced by each point's), ``prompt`` the
    text when one was given; ``baseline_prob`` is the target's unsteered probability.
    """

    kind: str
    target_token: int | None
    baseline_prob: float | None
    points: list[DoseResponsePoint]
    spec: SteeringSpec | None = None
    prompt: str | None = None
    target_token_str: str | None = None
    baseline_top_token: int | None = None
    prompt_tokens: list[str] | None = None
    model: str | None = None
    position: int = -1

    def describe(self) -> str:
        """The swept intervention (strength s), where it is measured and the sign convention."""
        return (f"{describe_steering(self.spec, self.prompt_tokens, sweep=True)}; effect = "
                f"steered \u2212 baseline, next token after "
                f"{position(self.position, self.prompt_tokens)}")

    def strengths(self) -> list[float]:
        return [p.strength for p in self.points]

    def kls(self) -> list[float]:
        return [p.kl_divergence for p in self.points]

    def target_probs(self) -> list[float | None]:
        return [p.target_prob for p in self.points]

    def to_html(self, path: str | Path, token_names: Any = None, title: str | None = None) -> Path:
        """An interactive chart of KL and the target's probability against strength."""
        return view("dose_response")(self, path, token_names=token_names, title=title)


def dose_response(model: MIModel, prompt: Any, spec: SteeringSpec, strengths: Sequence[float],
                  target: int | str | None = None, position: int = -1,
                  show_progress: bool | None = None) -> DoseResponseCurve:
    """Apply ``spec.with_strength(s)`` for each `s` and record KL, top token and the target's
    probability / logit change."""
    tgt = None if target is None else resolve_token(model, target)
    ids = as_ids(model, prompt)
    p = norm_position(position, ids.shape[1])
    steering_hooks(model, spec, ids.shape[1])  # validate before any compute
    base, cap = _baseline(model, ids, spec)  # one baseline run for the whole sweep
    pts = []
    base_prob = None
    for s in progress(list(strengths), "dose", enabled=show_progress):
        r = _steer(model, ids, spec.with_strength(float(s)), p, base, cap)
        e = None if tgt is None else r.effect(tgt)
        if e is not None:
            base_prob = e.baseline_prob
        top = r.top_token()
        pts.append(DoseResponsePoint(float(s), r.kl_divergence(), top,
                                     None if e is None else e.intervened_prob,
                                     None if e is None else e.logit_diff,
                                     r.steered_attention, token_str(model, top),
                                     None if e is None else e.prob_diff,
                                     None if e is None else e.logprob_diff))
    return DoseResponseCurve(spec.kind, tgt, base_prob, pts, spec, _prompt_text(prompt),
                             None if tgt is None else token_str(model, tgt),
                             int(base.output[0, p].argmax()), str_tokens(model, ids),
                             model_label(model), p)


def contrastive_steering_vector(model: MIModel, positive: Sequence[str] | Any,
                                negative: Sequence[str] | Any, layer: int,
                                point: str = "hook_resid_pre", position: int | str = -1,
                                normalize: bool = False) -> torch.Tensor:
    """mean(activation on positive prompts) - mean(activation on negative prompts) [d_model]
    at ``blocks.{layer}.{point}``, read at `position` (an index, or "mean" over positions).

    Prompts are run one at a time, so lengths may differ.
    """
    (layer,) = check_layers([layer], model.num_layers)
    hp = HookPoint.layer_point(layer, point)
    require_points(model, [hp])

    def mean_act(prompts: Sequence[Any]) -> torch.Tensor:
        if not len(prompts):
            raise InterventionError("contrastive steering needs at least one prompt per side")
        acc = []
        for pr in prompts:
            a = model.forward(as_ids(model, pr), HookSpec().capture(hp)).require(hp)[0].float()
            acc.append(a.mean(0) if position == "mean" else a[norm_position(int(position), a.shape[0])])
        return torch.stack(acc).mean(0)

    v = mean_act(list(positive)) - mean_act(list(negative))
    return v / v.norm().clamp_min(1e-12) if normalize else v
