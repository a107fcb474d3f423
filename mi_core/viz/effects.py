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
    probability changed most (absolute), baseline's top first."""
    p0, p1 = torch.softmax(baseline, -1), torch.softmax(intervened, -1)
    out: list[int] = []
    for idx in (p0.topk(n).indices, p1.topk(n).indices, (p1 - p0).abs().topk(n).indices):
        out += [int(i) for i in idx if int(i) not in out]
    return out


def comparison_html(baseline_logits: torch.Tensor, intervened_logits: torch.Tensor,
                    path: str | Path, token_names: TokenNames = None, label: str = "intervened",
                    *, title: str = "intervention effect", subtitle: str = "",
                    prompt: str | None = None, n: int = 15,
                    summary: Sequence[tuple[str, float]] = ()) -> Path:
    """Write the baseline-vs-intervened page from two next-token logit vectors [vocab].

    `token_names`: id -> text (a dict or a function; e.g. ``model.to_string([i])``).
    `summary`: extra (measure, value) rows shown above the table (KL is always shown).
    """
    b = baseline_logits.detach().double().cpu().reshape(-1)
    a = intervened_logits.detach().double().cpu().reshape(-1)
    if b.shape != a.shape:
        raise ConfigError(f"comparison_html: baseline logits {list(b.shape)} and intervened "
                          f"logits {list(a.shape)} differ in shape")
    name = _namer(token_names)
    lp0, lp1 = torch.log_softmax(b, -1), torch.log_softmax(a, -1)
    kl = float((lp0.exp() * (lp0 - lp1)).sum())
    rows = []
    for i in comparison_rows(b, a, n):
        rows.append({"id": i, "token": name(i), "p_base": float(lp0[i].exp()),
                     "p_int": float(lp1[i].exp()), "d_prob": float(lp1[i].exp() - lp0[i].exp()),
                     "lp_base": float(lp0[i]), "lp_int": float(lp1[i]),
                     "d_logprob": float(lp1[i] - lp0[i]), "logit_base": float(b[i]),
                     "logit_int": float(a[i]), "d_logit": float(a[i] - b[i]),
                     "rank_base": int((b > b[i]).sum()), "rank_int": int((a > a[i]).sum())})
    data = {"label": label, "rows": rows,
            "summary": [[f"KL(baseline || {label}) (nats)", kl]]
            + [[k, float(v)] for k, v in summary]}
    return write_page(path, "compare", title, data, subtitle, prompt)


def ablation_html(result: Any, path: str | Path, title: str = "attention knockout",
                  label: str = "knocked out", token_names: TokenNames = None,
                  prompt: str | None = None, subtitle: str = "") -> Path:
    """An ``AblationResult`` (knockout / ablation) as the comparison page."""
    if result.baseline_logits is None or result.ablated_logits is None:
        raise ConfigError("the knockout view needs the raw logits, which this result was read "
                          "without (write it with to_json(..., raw=True) / --raw)")
    names = token_names if token_names is not None else getattr(result, "token_strs", None)
    spec = getattr(result, "spec", None)
    sub = subtitle or (f"next-token distribution at position {result.position}"
                       + (f"; {spec}" if spec is not None else ""))
    return comparison_html(result.baseline_logits, result.ablated_logits, path, names, label,
                           title=title, subtitle=sub,
                           prompt=prompt if prompt is not None else getattr(result, "prompt", None))


def steering_html(result: Any, path: str | Path, title: str = "steering",
                  token_names: TokenNames = None, prompt: str | None = None) -> Path:
    """A ``SteeringResult`` as the comparison page."""
    summary = []
    if getattr(result, "baseline_attention", None) is not None:
        summary.append(("attention to the steered keys, baseline", result.baseline_attention))
    if getattr(result, "steered_attention", None) is not None:
        summary.append(("attention to the steered keys, steered", result.steered_attention))
    return comparison_html(result.baseline_logits, result.steered_logits, path, token_names,
                           "steered", title=title,
                           subtitle=f"next-token distribution at position {result.position}",
                           prompt=prompt if prompt is not None else getattr(result, "prompt", None),
                           summary=summary)


def dose_response_html(curve: Any, path: str | Path, token_names: TokenNames = None,
                       title: str | None = None, prompt: str | None = None,
                       subtitle: str = "") -> Path:
    """A ``DoseResponseCurve`` as an interactive chart (KL and target probability vs strength)."""
    name = _namer(token_names)
    pts = [{"strength": p.strength, "kl": p.kl_divergence,
            "top_token": getattr(p, "top_token_str", None) or name(p.top_token),
            "target_prob": p.target_prob, "target_logit_diff": p.target_logit_diff,
            "target_prob_diff": getattr(p, "target_prob_diff", None),
            "target_logprob_diff": getattr(p, "target_logprob_diff", None),
            "attention": p.steered_attention} for p in curve.points]
    target = None
    if curve.target_token is not None:
        target = getattr(curve, "target_token_str", None) or name(curve.target_token)
    spec = getattr(curve, "spec", None)
    data = {"points": pts, "target": target, "baseline_prob": curve.baseline_prob}
    return write_page(path, "dose", title or f"dose-response ({curve.kind} steering)", data,
                      subtitle or ("" if spec is None else str(spec)),
                      prompt if prompt is not None else getattr(curve, "prompt", None))
