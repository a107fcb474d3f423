"""Logit lens: what the model would predict after each layer (final norm + unembedding).

    python examples/logit_lens.py [MODEL]
"""

from __future__ import annotations

import mi_core as mi


def main(model: mi.MIModel | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    lens = mi.LogitLensAnalysis(k=3, targets=[" Paris"]).run(model, "The capital of France is")
    print(lens.format_table())
    paris = lens.points[0].targets[0].token_id
    first = lens.first_point_with_top1(paris)
    print(f"' Paris' is top-1 from {first.label if first else 'no layer'} on; "
          f"final probability {lens.points[-1].targets[0].prob:.3f}")
    return {"first_layer": first.layer if first else None, "final_top1": lens.points[-1].top[0].token}


if __name__ == "__main__":
    main()
