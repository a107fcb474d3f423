"""Attention knockout and activation ablation, with the result type that measures their effect.

A knockout removes attention edges (query -> key) by adding ``-inf`` to the pre-softmax
scores (``blocks.{i}.attn.hook_attn_scores``) through :class:`mi_core.Knockout`.
A query row whose every key is removed would be ``softmax([-inf, ...]) = NaN``; the hooks
built here also zero such rows at ``hook_pattern``, so that query attends to nothing (its
attention output is the bias only) and the result is never NaN.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import attrs
import torch

from mi_core.backend import MIModel, require_points
from mi_core.errors import InterventionError
from mi_core.hooks import HookLike, HookPoint, HookSpec
from mi_core.interp._common import (
    as_ids, check_heads, check_layers, norm_position, norm_positions, token_str,
)
from mi_core.interventions import Knockout, Replace


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


@functools.lru_cache(maxsize=64)
def _mask_cached(spec: KnockoutSpec, n_heads: int, seq: int, device: str,
                 dtype: torch.dtype) -> torch.Tensor:
    heads = check_heads(spec.heads, n_heads)
    keep = torch.ones(n_heads, seq, seq, dtype=torch.bool)
    for q, k in spec.edges:
        qq, kk = norm_position(q, seq, "query position"), norm_position(k, seq, "key position")
        keep[heads, qq, kk] = False
    if spec.from_positions is not None or spec.to_positions is not None:
        qs = norm_positions(spec.from_positions, seq, "query position")
        ks = norm_positions(spec.to_positions, seq, "key position")
        sel = torch.zeros(seq, seq, dtype=torch.bool)
        sel[torch.tensor(qs)[:, None], torch.tensor(ks)[None, :]] = True
        keep[heads] &= ~sel
    mask = torch.zeros(1, n_heads, seq, seq, dtype=dtype)
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
    require_points(model, need)
    mask = create_knockout_mask(spec, model.num_heads, seq_len, model.device, model.dtype)
    hooks = hooks if hooks is not None else HookSpec()
    for layer in layers:
        hooks.intervene(HookPoint.attn_scores(layer), Knockout(mask))
        hooks.intervene(HookPoint.attn_pattern(layer), _zero_nan_rows)
    return hooks


@attrs.define
class ChangedToken:
    token_id: int
    token: str
    baseline_prob: float
    ablated_prob: float
    abs_diff: float


@attrs.define
class AblationResult:
    """Baseline vs ablated logits at one position (``[vocab]`` each, float32)."""

    baseline_logits: torch.Tensor
    ablated_logits: torch.Tensor
    position: int = -1
    token_strs: dict[int, str] = attrs.field(factory=dict)

    def kl_divergence(self) -> float:
        """KL(baseline || ablated) in nats."""
        return kl_divergence(self.baseline_logits, self.ablated_logits)

    def logit_diff(self, token: int) -> float:
        """baseline logit - ablated logit of `token` (positive: the ablation lowered it)."""
        return float(self.baseline_logits[token] - self.ablated_logits[token])

    def prob_diff(self, token: int) -> float:
        p0 = torch.softmax(self.baseline_logits.float(), -1)[token]
        p1 = torch.softmax(self.ablated_logits.float(), -1)[token]
        return float(p0 - p1)

    def top_changed_tokens(self, k: int = 10) -> list[ChangedToken]:
        """The `k` tokens whose probability changed most (absolute), largest first."""
        p0 = torch.softmax(self.baseline_logits.float(), -1)
        p1 = torch.softmax(self.ablated_logits.float(), -1)
        d = (p0 - p1).abs()
        vals, idx = d.topk(min(k, d.numel()))
        return [ChangedToken(int(i), self.token_strs.get(int(i), f"<{int(i)}>"), float(p0[i]),
                             float(p1[i]), float(v)) for v, i in zip(vals, idx)]


def kl_rows(p_logits: torch.Tensor, q_logits: torch.Tensor,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """KL(softmax(p) || softmax(q)) over the last dim, one value per row (nats), in `dtype`."""
    lp = torch.log_softmax(p_logits.to(dtype), -1)
    lq = torch.log_softmax(q_logits.to(dtype), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(softmax(p) || softmax(q)) over the last dim, summed (nats); finite for finite logits."""
    return float(kl_rows(p_logits, q_logits).sum())


def ablation_result(model: MIModel, baseline: torch.Tensor, ablated: torch.Tensor,
                    position: int = -1, k_names: int = 20) -> AblationResult:
    """Build an AblationResult from two logits tensors [1, seq, vocab] at `position`."""
    seq = baseline.shape[1]
    p = norm_position(position, seq)
    b, a = baseline[0, p].detach().float().cpu(), ablated[0, p].detach().float().cpu()
    res = AblationResult(b, a, p)
    names = set(b.topk(k_names).indices.tolist()) | set(a.topk(k_names).indices.tolist())
    names |= {c.token_id for c in res.top_changed_tokens(k_names)}
    res.token_strs = {i: token_str(model, i) for i in sorted(names)}
    return res


def run_with_ablation(model: MIModel, prompt: Any, hooks: HookSpec, position: int = -1
                      ) -> AblationResult:
    """Run `prompt` clean and with `hooks`; compare the logits at `position`."""
    ids = as_ids(model, prompt)
    base = model.forward(ids).output
    abl = model.forward(ids, hooks).output
    return ablation_result(model, base, abl, position)


def run_knockout(model: MIModel, prompt: Any, spec: KnockoutSpec, position: int = -1
                 ) -> AblationResult:
    """Knock out `spec`'s edges and measure the effect at `position`."""
    ids = as_ids(model, prompt)
    return run_with_ablation(model, ids, knockout_hooks(model, spec, ids.shape[1]), position)


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
