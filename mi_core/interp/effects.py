"""The one metric convention of knockout, steering and patching results.

Every effect is **intervened − baseline**: a negative number means the intervention lowered
the quantity. Beside the raw logit difference (which depends on the logits' arbitrary
additive offset, so it is not comparable across positions or models) each token effect
carries shift-invariant measures: the change of probability and of log-probability (nats),
and each result carries KL(baseline || intervened) of the whole next-token distribution.

A token going from p = 0.92 to p = 0.0001 reads ``prob_diff -0.92``, ``logprob_diff -9.1``:
the log-probability change is what to compare, the logit change is reported for reference.
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs
import torch


@attrs.define
class TokenEffect:
    """How one token's next-token prediction changed (all differences intervened − baseline).

    ``logprob_diff`` is in nats and shift-invariant; ``logit_diff`` is the raw logit change.
    """

    token_id: int
    token: str
    baseline_prob: float
    intervened_prob: float
    prob_diff: float
    logprob_diff: float
    logit_diff: float


@attrs.define
class EffectSummary:
    """The small, JSON-friendly summary of an intervention at one position.

    ``kl_divergence``: KL(baseline || intervened) in nats; ``baseline_top``: the effect on
    the baseline's top-1 token; ``intervened_top``: the intervened run's top-1 token;
    ``top_changed``: the tokens whose probability changed most (by |prob_diff|), largest first.
    """

    kl_divergence: float
    baseline_top: TokenEffect
    intervened_top: TokenEffect
    top_changed: list[TokenEffect]


def kl_rows(p_logits: torch.Tensor, q_logits: torch.Tensor,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """KL(softmax(p) || softmax(q)) over the last dim, one value per row (nats), in `dtype`."""
    lp = torch.log_softmax(p_logits.to(dtype), -1)
    lq = torch.log_softmax(q_logits.to(dtype), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(softmax(p) || softmax(q)) over the last dim, summed (nats); finite for finite logits."""
    return float(kl_rows(p_logits, q_logits).sum())


def token_effects(baseline: torch.Tensor, intervened: torch.Tensor, token_ids: Sequence[int],
                  name: Callable[[int], str]) -> list[TokenEffect]:
    """The :class:`TokenEffect` of each of `token_ids` between two logit vectors [vocab]."""
    b, a = baseline.detach().float().cpu(), intervened.detach().float().cpu()
    lb, la = torch.log_softmax(b, -1), torch.log_softmax(a, -1)
    out = []
    for i in token_ids:
        i = int(i)
        pb, pa = float(lb[i].exp()), float(la[i].exp())
        out.append(TokenEffect(i, name(i), pb, pa, pa - pb, float(la[i] - lb[i]),
                               float(a[i] - b[i])))
    return out


def top_changed(baseline: torch.Tensor, intervened: torch.Tensor, k: int,
                name: Callable[[int], str]) -> list[TokenEffect]:
    """The `k` tokens (at most the vocabulary) whose probability changed most, largest first."""
    d = (torch.softmax(intervened.float(), -1) - torch.softmax(baseline.float(), -1)).abs()
    idx = d.topk(max(0, min(int(k), d.numel()))).indices.tolist()
    return token_effects(baseline, intervened, idx, name)


def effect_summary(baseline: torch.Tensor, intervened: torch.Tensor,
                   name: Callable[[int], str], k: int = 10) -> EffectSummary:
    """KL, the baseline's and the intervened run's top-1 tokens, and the `k` most changed."""
    b_top, a_top = int(baseline.argmax()), int(intervened.argmax())
    return EffectSummary(kl_divergence(baseline, intervened),
                         *token_effects(baseline, intervened, [b_top, a_top], name),
                         top_changed(baseline, intervened, k, name))
