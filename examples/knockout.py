"""Attention knockout: stop the last token from reading the subject, measure the damage.

    python examples/knockout.py [MODEL]
"""

from __future__ import annotations

import mi_core as mi
from mi_core.interp import run_knockout


def main(model: mi.MIModel | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    prompt = "The capital of France is"
    ids = model.to_tokens(prompt)
    toks = model.to_str_tokens(ids[0])
    subject = next(i for i, t in enumerate(toks) if "France" in t)
    n = model.num_layers
    results = {}
    for name, layers in (("early", range(0, n // 3)), ("middle", range(n // 3, 2 * n // 3)),
                         ("late", range(2 * n // 3, n))):
        spec = mi.KnockoutSpec(layers=list(layers), from_positions=[-1], to_positions=[subject])
        r = run_knockout(model, ids, spec)
        paris = r.summary.baseline_top  # effects are knocked out - baseline
        results[name] = paris.logprob_diff
        print(f"knock out last -> {toks[subject]!r} in {name:6s} layers: "
              f"KL {r.kl_divergence():.4f}, {paris.token!r}: p {paris.baseline_prob:.3f} -> "
              f"{paris.intervened_prob:.3f}, log p {paris.logprob_diff:+.3f} "
              f"(logit {paris.logit_diff:+.3f})")
    # every key of the last query: documented to give zero attention, never NaN
    r = run_knockout(model, ids, mi.KnockoutSpec(from_positions=[-1]))
    print(f"all keys of the last token knocked out in all layers: KL {r.kl_divergence():.3f}, "
          f"most changed token {r.top_changed_tokens(1)[0].token!r}, no NaN")
    return results


if __name__ == "__main__":
    main()
