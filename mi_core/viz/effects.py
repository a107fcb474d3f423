"""Views of intervention effects: the next-token distribution before and after an
intervention (knockout, ablation, steering) and a steering dose-response sweep.

Sign convention everywhere: effect = intervened - baseline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from mi_core.plugin import ConfigError
from mi_core.viz._page import write_page
from mi_core.viz._safe import check_size, number

TokenNames = Callable[[int], str] | Mapping[int, str] | None


def _namer(names: TokenNames) -> Callable[[int], str]:
    if names is None:
        return lambda i: f"<{i}>"
    if callable(names):
        return names
    return lambda i: names.get(i, f"<{i}>")


def comparison_rows(baseline: torch.Tensor, intervened: torch.Tensor, n: int = 15
                    ) -> list[int]:
    """Token ids worth showing: the top-`n` of each distribution and the `n` whose
    probability changed most (absolute), baseline's top first (`n` is clamped to the
    vocabulary, so a 10-token vocabulary works)."""
    p0, p1 = torch.softmax(baseline, -1), torch.softmax(intervened, -1)
    n = min(int(n), p0.numel())
    out: list[int] = []
    for idx in (p0.topk(n).indices, p1.topk(n).indices, (p1 - p0).abs().topk(n).indices):
        out += [int(i) for i in idx if int(i) not in out]
    return out


def _logits(x: Any, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"comparison_html: {what} logits must be a tensor [vocab], got "
                          f"{type(x).__name__}")
    t = x.detach().double().cpu()
    if t.dim() > 1 and all(d == 1 for d in t.shape[:-1]):
        t = t.reshape(-1)
    if t.dim() != 1 or t.numel() == 0:
        raise ConfigError(f"comparison_html: {what} logits must be one vector [vocab], got "
                          f"shape {list(x.shape)}")
    return t


def comparison_html(baseline_logits: torch.Tensor, intervened_logits: torch.Tensor,
                    path: str | Path, token_names: TokenNames = None, label: str = "intervened",
                    *, title: str = "intervention effect", subtitle: str = "",
                    prompt: str | None = None, n: int = 15,
                    summary: Sequence[tuple[str, float]] = ()) -> Path:
    """Write the baseline-vs-intervened page from two next-token logit vectors [vocab].

    `token_names`: id -> text (a dict or a function; e.g. ``model.to_string([i])``).
    `summary`: extra (measure, value) rows shown above the table (KL is always shown).
    `subtitle`: one line saying what was done. NaN logits are shown as NaN.
    """
    b, a = _logits(baseline_logits, "baseline"), _logits(intervened_logits, "intervened")
    if b.shape != a.shape:
        raise ConfigError(f"comparison_html: baseline logits {list(b.shape)} and intervened "
                          f"logits {list(a.shape)} differ in shape")
    if int(n) < 1:
        raise ConfigError(f"comparison_html: n must be at least 1, got {n}")
    name = _namer(token_names)
    lp0, lp1 = torch.log_softmax(b, -1), torch.log_softmax(a, -1)
    kl = float((lp0.exp() * (lp0 - lp1)).sum())
    rows = []
    for i in comparison_rows(b, a, n):
        token = name(i)
        if not isinstance(token, str):
            raise ConfigError(f"comparison_html: token_names gave {type(token).__name__} "
                              f"{token!r:.40} for token {i}, not a string")
        rows.append({"id": i, "token": token, "p_base": float(lp0[i].exp()),
                     "p_int": float(lp1[i].exp()), "d_prob": float(lp1[i].exp() - lp0[i].exp()),
                     "lp_base": float(lp0[i]), "lp_int": float(lp1[i]),
                     "d_logprob": float(lp1[i] - lp0[i]), "logit_base": float(b[i]),
                     "logit_int": float(a[i]), "d_logit": float(a[i] - b[i]),
                     "rank_base": int((b > b[i]).sum()), "rank_int": int((a > a[i]).sum())})
    extra = [[str(k), number(v, "comparison_html", f"summary {k!r}")] for k, v in summary]
    data = {"label": str(label), "rows": rows, "vocab": int(b.numel()),
            "summary": [[f"KL(baseline || {label}) (nats)", kl]] + extra}
    return write_page(path, "compare", title, data, subtitle, prompt)


def _title(kind: str, model: Any) -> str:
    return f"{kind}, {model}" if model else kind


def ablation_html(result: Any, path: str | Path, title: str | None = None,
                  label: str = "knocked out", token_names: TokenNames = None,
                  prompt: str | None = None, subtitle: str = "") -> Path:
    """An ``AblationResult`` (knockout / ablation) as the comparison page; the subtitle
    says which edges were removed in which layers and heads (``result.describe()``)."""
    if result.baseline_logits is None or result.ablated_logits is None:
        raise ConfigError("the knockout view needs the raw logits, which this result was read "
                          "without (write it with to_json(..., raw=True) / --raw)")
    names = token_names if token_names is not None else getattr(result, "token_strs", None)
    describe = getattr(result, "describe", None)
    sub = subtitle or (describe() if describe is not None
                       else f"next-token distribution at position {result.position}")
    kind = "attention knockout" if getattr(result, "spec", None) is not None else "ablation"
    return comparison_html(result.baseline_logits, result.ablated_logits, path, names, label,
                           title=title or _title(kind, getattr(result, "model", None)),
                           subtitle=sub,
                           prompt=prompt if prompt is not None else getattr(result, "prompt", None))


def steering_html(result: Any, path: str | Path, title: str | None = None,
                  token_names: TokenNames = None, prompt: str | None = None,
                  subtitle: str = "") -> Path:
    """A ``SteeringResult`` as the comparison page; the subtitle names the hook point,
    layers, positions and strength (``result.describe()``), never the direction's values."""
    summary = []
    if getattr(result, "baseline_attention", None) is not None:
        summary.append(("attention to the steered keys, baseline", result.baseline_attention))
    if getattr(result, "steered_attention", None) is not None:
        summary.append(("attention to the steered keys, steered", result.steered_attention))
    describe = getattr(result, "describe", None)
    sub = subtitle or (describe() if describe is not None
                       else f"next-token distribution at position {result.position}")
    spec = getattr(result, "spec", None)
    kind = f"{spec.kind} steering" if spec is not None else "steering"
    return comparison_html(result.baseline_logits, result.steered_logits, path, token_names,
                           "steered", title=title or _title(kind, getattr(result, "model", None)),
                           subtitle=sub,
                           prompt=prompt if prompt is not None else getattr(result, "prompt", None),
                           summary=summary)


def _point(p: Any, name: Callable[[int], str], i: int) -> dict[str, Any]:
    where = f"dose_response_html: point {i}"
    top = getattr(p, "top_token_str", None)
    return {"strength": number(p.strength, where, "strength", optional=False),
            "kl": number(p.kl_divergence, where, "kl_divergence"),
            "top_token": top if isinstance(top, str) else name(p.top_token),
            "target_prob": number(p.target_prob, where, "target_prob"),
            "target_logit_diff": number(p.target_logit_diff, where, "target_logit_diff"),
            "target_prob_diff": number(getattr(p, "target_prob_diff", None), where,
                                       "target_prob_diff"),
            "target_logprob_diff": number(getattr(p, "target_logprob_diff", None), where,
                                          "target_logprob_diff"),
            "attention": number(p.steered_attention, where, "steered_attention")}


def dose_response_html(curve: Any, path: str | Path, token_names: TokenNames = None,
                       title: str | None = None, prompt: str | None = None,
                       subtitle: str = "") -> Path:
    """A ``DoseResponseCurve`` as an interactive chart (KL and target probability vs
    strength). The subtitle names the swept intervention (``curve.describe()``); a
    residual direction is described by its size and norm, never printed."""
    name = _namer(token_names)
    check_size(len(curve.points), 10_000, "strengths", "dose_response_html",
               "sweep fewer strengths")
    pts = [_point(p, name, i) for i, p in enumerate(curve.points)]
    target = None
    if curve.target_token is not None:
        target = getattr(curve, "target_token_str", None) or name(curve.target_token)
    describe = getattr(curve, "describe", None)
    sub = subtitle or (describe() if describe is not None else "")
    data = {"points": pts, "target": target, "kind": curve.kind,
            "baseline_prob": number(curve.baseline_prob, "dose_response_html", "baseline_prob")}
    return write_page(path, "dose", title or _title(f"dose-response of {curve.kind} steering",
                                                    getattr(curve, "model", None)),
                      data, sub, prompt if prompt is not None else getattr(curve, "prompt", None))
