"""What ``mi demo`` / ``mi run`` compute, and the results of commands that have no result
class of their own elsewhere. Imported when such a command runs (it needs torch)."""

from __future__ import annotations

import time
from typing import Any

import attrs
import torch

from mi_cli.models import DEFAULT_PROMPT
from mi_cli.output import num
from mi_core.interp import KnockoutSpec, LogitLensAnalysis, TokenEffect, run_knockout


@attrs.define
class TokenProb:
    token_id: int
    token: str
    prob: float


@attrs.define
class LensRow:
    """The logit lens after one layer: its label ("L29") and top tokens."""

    label: str
    top: list[TokenProb]


@attrs.define
class DemoResult:
    """What ``mi demo`` / ``mi run`` compute. Knockout effects are knocked out − baseline."""

    model: str
    prompt: str
    top_next: list[TokenProb]
    #: (label, top-1 token, its probability) after every layer
    logit_lens_top1: list[tuple[str, str, float]]
    #: top-3 after the last layers
    logit_lens_last: list[LensRow]
    #: the first layer from which the model's answer stays the lens' top-1 (None: never)
    answer_settles_at: int | None
    #: the first layer where the answer is among the lens' top 3 (None: never)
    answer_top3_at: int | None
    knockout_layers: list[int]
    knockout_description: str
    knockout_kl: float
    #: the effect of the knockout on the model's answer (top-1 next token)
    knockout_answer: TokenEffect
    knockout_top_changed: list[TokenEffect]
    seconds: float


def demo(model: Any, prompt: str = DEFAULT_PROMPT, k: int = 5) -> DemoResult:
    """Top-k next tokens, the logit lens at the last position, and the effect of knocking out
    the last token's attention to every earlier token in the middle third of the layers."""
    t0 = time.perf_counter()
    ids = model.to_tokens(prompt)
    logits = model.forward(ids).output[0, -1].float()
    probs = torch.softmax(logits, -1)
    pv, pi = probs.topk(min(k, probs.numel()))
    top = [TokenProb(int(i), model.to_string([int(i)]), float(v)) for v, i in zip(pv, pi)]
    lens = LogitLensAnalysis(k=min(3, probs.numel())).run(model, ids)
    answer = top[0].token_id
    settles = None
    for p in reversed(lens.points):
        if p.top[0].token_id != answer:
            break
        settles = p.layer
    top3_at = next((p.layer for p in lens.points if answer in [t.token_id for t in p.top]), None)
    last = [LensRow(p.label, [TokenProb(t.token_id, t.token, t.prob) for t in p.top])
            for p in lens.points[-4:]]
    n = model.num_layers
    layers = list(range(n // 3, max(n // 3 + 1, 2 * n // 3)))
    seq = ids.shape[1]
    spec = KnockoutSpec(layers=layers, from_positions=[seq - 1],
                        to_positions=list(range(seq - 1)) or [0])
    abl = run_knockout(model, ids, spec)
    assert abl.summary is not None
    return DemoResult(model.source, prompt, top,
                      [(p.label, p.top[0].token, p.top[0].prob) for p in lens.points], last,
                      settles, top3_at, layers,
                      f"last token -> all earlier tokens, layers {layers[0]}-{layers[-1]}",
                      abl.kl_divergence(), abl.summary.baseline_top, abl.top_changed_tokens(5),
                      time.perf_counter() - t0)


def format_demo(r: DemoResult) -> str:
    tp = lambda t: f"{t.token!r} {t.prob:.2f}"  # noqa: E731
    n = len(r.logit_lens_top1)
    a = r.knockout_answer
    lines = [f"model: {r.model}", f"prompt: {r.prompt!r}", "", "top next tokens:"]
    lines += [f"  {t.token!r:>16}  {t.prob:6.3f}" for t in r.top_next]
    lines += ["", "logit lens (last position: the residual stream after each layer, read "
              "through the final norm and unembedding):"]
    if r.answer_settles_at is not None:
        lines.append(f"  {r.top_next[0].token!r} enters the top 3 at L{r.answer_top3_at} and is "
                     f"the top prediction from L{r.answer_settles_at} on (layers L0-L{n - 1}):")
    else:
        lines.append(f"  {r.top_next[0].token!r} is not the lens' top-1; the last layers' top 3:")
    lines += [f"  {row.label:>5}: " + ", ".join(tp(t) for t in row.top)
              for row in r.logit_lens_last]
    lines += ["", f"attention knockout ({r.knockout_description}), knocked out - baseline:",
              f"  KL(baseline || knocked out) = {num(r.knockout_kl)} nats",
              f"  {a.token!r}: p {a.baseline_prob:.3f} -> {a.intervened_prob:.3f}, "
              f"log p {num(a.logprob_diff, '+.3f')} nats (logit {num(a.logit_diff, '+.3f')})",
              "  most changed: " + ", ".join(f"{t.token!r} {t.baseline_prob:.3f} -> "
                                             f"{t.intervened_prob:.3f}"
                                             for t in r.knockout_top_changed),
              "", f"({r.seconds:.2f} s)"]
    return "\n".join(lines)


@attrs.define
class AttentionResult:
    """``mi attention``: one layer's pattern [q, k] (one head, or the mean over heads)."""

    layer: int
    head: int | None
    tokens: list[str]
    pattern: torch.Tensor  # [q, k] (head) or mean over heads
    prompt: str | None = None
    model: str | None = None
