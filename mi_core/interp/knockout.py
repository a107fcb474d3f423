"""Attention knockout and activation ablation, with the result type that measures their effect.

A knockout removes attention edges (query -> key) by adding ``-inf`` to the pre-softmax
scores (``blocks.{i}.attn.hook_attn_scores``) through :class:`mi_core.Knockout`.
A query row whose every key is removed would be ``softmax([-inf, ...]) = NaN``; the hooks
built here also zero such rows at ``hook_pattern``, so that query attends to nothing (its
attention output is the bias only) and the result is never NaN.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any, ClassVar, Sequence

import attrs
import torch

from mi_core.plugin import (
    HookLike, HookPoint, HookSpec, InterventionError, Knockout, MIModel, Replace, require_points, view,
)
from mi_core.interp._common import (
    as_ids, check_heads, check_layers, norm_position, norm_positions, token_str,
)
from mi_core.interp.describe import describe_knockout, model_label, position, str_tokens
from mi_core.interp.effects import (  # noqa: F401  (kl_rows re-exported for mi_core.interp.state)
    EffectSummary, TokenEffect, effect_summary, kl_divergence, kl_rows, token_effects, top_changed,
)


def _tuple(v: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if v is None else tuple(int(x) for x in v)


def _edges(v: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(a), int(b)) for a, b in v)


@attrs.frozen
class KnockoutSpec:
    """Which attention edges to remove, where.

    ``layers`` / ``heads``: None means all. Removed edges (query -> key) are the explicit
    ``edges`` plus every pair in ``from_positions`` x ``to_positions`` (None = all positions
    on that side, but at least one side must be given when there are no explicit edges).
    Negative positions count from the end. Builder methods return new specs:
    ``KnockoutSpec().layer(8).edge(-1, 0)``.
    """

    layers: tuple[int, ...] | None = attrs.field(default=None, converter=_tuple)
    heads: tuple[int, ...] | None = attrs.field(default=None, converter=_tuple)
    edges: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_edges)
    from_positions: tuple[int, ...] | None = attrs.field(default=None, converter=_tuple)
    to_positions: tuple[int, ...] | None = attrs.field(default=None, converter=_tuple)

    def layer(self, layer: int) -> "KnockoutSpec":
        return attrs.evolve(self, layers=(self.layers or ()) + (layer,))

    def layer_range(self, start: int, stop: int) -> "KnockoutSpec":
        return attrs.evolve(self, layers=(self.layers or ()) + tuple(range(start, stop)))

    def head(self, head: int) -> "KnockoutSpec":
        return attrs.evolve(self, heads=(self.heads or ()) + (head,))

    def edge(self, query: int, key: int) -> "KnockoutSpec":
        return attrs.evolve(self, edges=self.edges + ((query, key),))

    def from_to(self, queries: Sequence[int] | None, keys: Sequence[int] | None) -> "KnockoutSpec":
        return attrs.evolve(self, from_positions=queries, to_positions=keys)

    def is_empty(self) -> bool:
        return not self.edges and self.from_positions is None and self.to_positions is None

    def describe(self, tokens: Sequence[str] | None = None) -> str:
        """One line: "layers 8-15, all heads; removed edges query → key: 4 ' is' → 3
        ' France'" (token names when `tokens`, the prompt's tokens, are given)."""
        return describe_knockout(self, tokens)


@functools.lru_cache(maxsize=64)
def _mask_cached(spec: KnockoutSpec, n_heads: int, seq: int, device: str,
                 dtype: torch.dtype) -> torch.Tensor:
    heads = check_heads(spec.heads, n_heads)
    # built on the CPU (a few small index writes) and moved once; the result is cached
    cpu = torch.device("cpu")
    keep = torch.ones(n_heads, seq, seq, dtype=torch.bool, device=cpu)
    for q, k in spec.edges:
        qq, kk = norm_position(q, seq, "query position"), norm_position(k, seq, "key position")
        keep[heads, qq, kk] = False
    if spec.from_positions is not None or spec.to_positions is not None:
        qs = norm_positions(spec.from_positions, seq, "query position")
        ks = norm_positions(spec.to_positions, seq, "key position")
        sel = torch.zeros(seq, seq, dtype=torch.bool, device=cpu)
        sel[torch.tensor(qs, device=cpu)[:, None], torch.tensor(ks, device=cpu)[None, :]] = True
        keep[heads] &= ~sel
    mask = torch.zeros(1, n_heads, seq, seq, dtype=dtype, device=cpu)
    mask[0][~keep] = float("-inf")
    return mask.to(device)


def create_knockout_mask(spec: KnockoutSpec, n_heads: int, seq_len: int,
                         device: str | torch.device = "cpu",
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive pre-softmax mask [1, n_heads, seq, seq]: 0 keeps, -inf removes.

    Cached per (spec, n_heads, seq_len, device, dtype); treat the result as read-only.
    InterventionError for an empty spec or a position / head out of range.
    """
    if spec.is_empty():
        raise InterventionError("KnockoutSpec removes nothing: give edges or from/to positions")
    return _mask_cached(spec, int(n_heads), int(seq_len), str(torch.device(device)), dtype)


def emptied_queries(spec: KnockoutSpec, n_heads: int, seq_len: int) -> list[int]:
    """Query positions that lose EVERY key they may attend to (keys <= query) in some head:
    softmax over nothing is undefined, so such a query attends to nothing at all (its
    attention output is the bias only) — rarely what a knockout means to test."""
    mask = create_knockout_mask(spec, n_heads, seq_len)[0]  # [heads, q, k], -inf = removed
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    empty = (torch.isinf(mask) | ~causal).all(-1).any(0)  # [q]
    return empty.nonzero().flatten().tolist()


def clear_mask_cache() -> None:
    _mask_cached.cache_clear()


def _zero_nan_rows(x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
    # softmax over an all -inf row gives NaN: that query attends to nothing instead.
    return torch.nan_to_num(x, nan=0.0)


def knockout_hooks(model: MIModel, spec: KnockoutSpec, seq_len: int,
                   hooks: HookSpec | None = None) -> HookSpec:
    """A HookSpec applying `spec` (Knockout at each layer's attention scores)."""
    layers = check_layers(spec.layers, model.num_layers)
    need = [HookPoint.attn_scores(layer) for layer in layers]
    need += [HookPoint.attn_pattern(layer) for layer in layers]
    # a layer without attention (a recurrent mixer) is refused naming the layer and its
    # type; mi.StateKnockoutSpec is the knockout of a recurrent layer
    model.require_points(need, "attention knockout")
    mask = create_knockout_mask(spec, model.num_heads, seq_len, model.device, model.dtype)
    empty = emptied_queries(spec, model.num_heads, seq_len)
    if empty:
        warnings.warn(f"the knockout removes every key of query position(s) {empty} (of "
                      f"{seq_len} tokens): those queries attend to nothing (attention output = "
                      "bias only), which is not an edge knockout; keep at least one key "
                      "(e.g. the query itself) or use a longer prompt", stacklevel=2)
    hooks = hooks if hooks is not None else HookSpec()
    for layer in layers:
        hooks.intervene(HookPoint.attn_scores(layer), Knockout(mask))
        hooks.intervene(HookPoint.attn_pattern(layer), _zero_nan_rows)
    return hooks


#: The per-token effect record of :meth:`AblationResult.top_changed_tokens` (kept name).
ChangedToken = TokenEffect


def _no_name(i: int) -> str:
    return f"<{i}>"


@attrs.define
class AblationResult:
    """The effect of a knockout / ablation on the next-token logits at one position.

    Every difference is **ablated − baseline** (see :mod:`mi_core.interp.effects`): a
    negative ``logit_diff`` / ``logprob_diff`` / ``prob_diff`` means the ablation lowered
    that token. ``summary`` holds KL and the top changed tokens; the raw logits
    ``baseline_logits`` / ``ablated_logits`` ([vocab] each, float32) are written to JSON only
    with ``to_json(result, raw=True)`` (CLI ``--raw``) and are None when read back without.
    ``spec``, ``prompt``, ``prompt_tokens`` and ``model`` record what was run (None when
    built by hand); :meth:`describe` says it in one line.
    """

    RAW_FIELDS: ClassVar[tuple[str, ...]] = ("baseline_logits", "ablated_logits")

    baseline_logits: torch.Tensor | None = None
    ablated_logits: torch.Tensor | None = None
    position: int = -1
    token_strs: dict[int, str] = attrs.field(factory=dict)
    spec: KnockoutSpec | None = None
    prompt: str | None = None
    summary: EffectSummary | None = None
    prompt_tokens: list[str] | None = None
    model: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.summary is None and self._has_raw():
            self.summary = effect_summary(self.baseline_logits, self.ablated_logits, self._name)

    def _has_raw(self) -> bool:
        return self.baseline_logits is not None and self.ablated_logits is not None

    def _name(self, i: int) -> str:
        return self.token_strs.get(int(i), f"<{int(i)}>")

    def _raw(self, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._has_raw():
            raise InterventionError(f"{what} needs the raw logits, which this result was read "
                                    "without (write it with to_json(..., raw=True) / --raw)")
        return self.baseline_logits, self.ablated_logits  # type: ignore[return-value]

    def _effect(self, token: int) -> TokenEffect:
        if not self._has_raw() and self.summary is not None:
            s = self.summary
            for e in [s.baseline_top, s.intervened_top, *s.top_changed]:
                if e.token_id == int(token):
                    return e
        b, a = self._raw(f"the effect on token {int(token)}")
        return token_effects(b, a, [int(token)], self._name)[0]

    def kl_divergence(self) -> float:
        """KL(baseline || ablated) in nats."""
        if not self._has_raw() and self.summary is not None:
            return self.summary.kl_divergence
        return kl_divergence(*self._raw("KL"))

    def logit_diff(self, token: int) -> float:
        """ablated − baseline raw logit of `token` (negative: the ablation lowered it)."""
        return self._effect(token).logit_diff

    def logprob_diff(self, token: int) -> float:
        """ablated − baseline log-probability of `token` in nats (shift-invariant)."""
        return self._effect(token).logprob_diff

    def prob_diff(self, token: int) -> float:
        """ablated − baseline probability of `token`."""
        return self._effect(token).prob_diff

    def top_changed_tokens(self, k: int = 10) -> list[TokenEffect]:
        """The `k` tokens whose probability changed most (by |ablated − baseline|), largest
        first; from the summary (at most its length) when the raw logits are absent."""
        if not self._has_raw() and self.summary is not None:
            return self.summary.top_changed[:k]
        return top_changed(*self._raw("top_changed_tokens"), k, self._name)

    def describe(self) -> str:
        """What was knocked out and where it is measured, in one line (for titles)."""
        what = describe_knockout(self.spec, self.prompt_tokens) if self.spec is not None \
            else "ablation"
        return (f"{what}; effect = knocked out \u2212 baseline, next token after "
                f"{position(self.position, self.prompt_tokens)}")

    def to_html(self, path: str | Path, title: str | None = None) -> Path:
        """An interactive page: baseline vs ablated next-token probabilities, sortable, with
        every effect as ablated − baseline (needs the raw logits)."""
        return view("ablation")(self, path, title=title)


def ablation_result(model: MIModel, baseline: torch.Tensor, ablated: torch.Tensor,
                    position: int = -1, k_names: int = 20, spec: KnockoutSpec | None = None,
                    prompt: str | None = None) -> AblationResult:
    """Build an AblationResult from two logits tensors [1, seq, vocab] at `position`.

    Token strings are kept for the `k_names` top tokens of each run and the most changed
    ones (clamped to the vocabulary size).
    """
    seq = baseline.shape[1]
    p = norm_position(position, seq)
    b, a = baseline[0, p].detach().float().cpu(), ablated[0, p].detach().float().cpu()
    k = min(int(k_names), b.numel())
    names = set(b.topk(k).indices.tolist()) | set(a.topk(k).indices.tolist())
    names |= {e.token_id for e in top_changed(b, a, k, _no_name)}
    strs = {i: token_str(model, i) for i in sorted(names)}
    return AblationResult(b, a, p, strs, spec, prompt)


def _prompt_text(prompt: Any) -> str | None:
    return prompt if isinstance(prompt, str) else None


def run_with_ablation(model: MIModel, prompt: Any, hooks: HookSpec, position: int = -1
                      ) -> AblationResult:
    """Run `prompt` clean and with `hooks`; compare the logits at `position`."""
    ids = as_ids(model, prompt)
    base = model.forward(ids).output
    abl = model.forward(ids, hooks).output
    return _named(ablation_result(model, base, abl, position, prompt=_prompt_text(prompt)),
                  model, ids)


def _named(r: AblationResult, model: MIModel, ids: torch.Tensor) -> AblationResult:
    r.prompt_tokens, r.model = str_tokens(model, ids), model_label(model)
    return r


def run_knockout(model: MIModel, prompt: Any, spec: KnockoutSpec, position: int = -1
                 ) -> AblationResult:
    """Knock out `spec`'s edges and measure the effect at `position`."""
    ids = as_ids(model, prompt)
    hooks = knockout_hooks(model, spec, ids.shape[1])
    base = model.forward(ids).output
    abl = model.forward(ids, hooks).output
    return _named(ablation_result(model, base, abl, position, spec=spec,
                                  prompt=_prompt_text(prompt)), model, ids)


def mean_ablation_hooks(model: MIModel, point: HookLike, reference: Any,
                        per_position: bool = False, hooks: HookSpec | None = None) -> HookSpec:
    """Replace `point` by its mean over `reference` prompts.

    The mean is over batch and positions (a vector broadcast to every position), or over
    the batch only when `per_position` (then the ablated prompt must have the same length).
    `reference`: ids [batch, seq] or a list of equal-length prompts.
    """
    hp = HookPoint.parse(point)
    require_points(model, [hp])
    ids = as_ids(model, reference) if not isinstance(reference, list) else model.to_tokens(reference)
    act = model.forward(ids, HookSpec().capture(hp)).require(hp).float()
    mean = act.mean(0, keepdim=True) if per_position else act.mean((0, 1), keepdim=True)
    hooks = hooks if hooks is not None else HookSpec()
    return hooks.intervene(hp, Replace(mean))


def resample_ablation_hooks(model: MIModel, point: HookLike, source: Any,
                            generator: torch.Generator | None = None,
                            hooks: HookSpec | None = None) -> HookSpec:
    """Replace `point` by its value on a randomly chosen prompt from `source` (same length).

    `source`: ids [n, seq] or a list of prompts of equal token length; the chosen row is
    broadcast over the ablated batch.
    """
    hp = HookPoint.parse(point)
    require_points(model, [hp])
    ids = as_ids(model, source) if not isinstance(source, list) else model.to_tokens(source)
    act = model.forward(ids, HookSpec().capture(hp)).require(hp)
    i = int(torch.randint(act.shape[0], (1,), generator=generator))
    hooks = hooks if hooks is not None else HookSpec()
    return hooks.intervene(hp, Replace(act[i:i + 1].clone()))
