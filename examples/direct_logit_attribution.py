"""Direct logit attribution: which layers and heads write " Paris" into the residual stream.

    python examples/direct_logit_attribution.py [MODEL]
"""

from __future__ import annotations

import mi_core as mi
from mi_core.interp import direct_logit_attribution


def main(model: mi.MIModel | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    r = direct_logit_attribution(model, "The capital of France is", token=" Paris",
                                 incorrect=" London", per_head=True)
    print(f"logit(' Paris') - logit(' London') = {r.total:.3f} "
          f"(components {sum(r.values):.3f} + constant {r.remainder:.3f})")
    for label, v in r.top(10):
        print(f"  {label:>8}  {v:+.3f}")
    return {"total": r.total, "sum": sum(r.values) + r.remainder, "top": r.top(3)}


if __name__ == "__main__":
    main()
