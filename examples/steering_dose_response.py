"""Steering dose-response: scale the last token's attention to the subject, and add a
contrastive direction to the residual stream; watch the prediction move.

    python examples/steering_dose_response.py [MODEL]
"""

from __future__ import annotations


import mi_core as mi
from mi_core.interp import SteeringSpec, contrastive_steering_vector, dose_response


def main(model: mi.MIModel | None = None, out: str | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    prompt = "The capital of France is"
    ids = model.to_tokens(prompt)
    toks = model.to_str_tokens(ids[0])
    subject = next(i for i, t in enumerate(toks) if "France" in t)
    n = model.num_layers
    spec = SteeringSpec.attention(range(n // 3, 2 * n // 3), to_positions=[subject], from_positions=[-1])
    cal = mi.SteeringCalibration.measure(model, ids, spec)
    print(f"baseline attention of the last token to {toks[subject]!r}: {cal.mean_attention:.3f}")
    curve = dose_response(model, ids, spec, [0.0, 0.5, 1.0, 2.0, 4.0], target=" Paris")
    print("attention scale -> attention, KL, p(' Paris')")
    for p in curve.points:
        print(f"  {p.strength:4.1f} -> {p.steered_attention:.3f}  {p.kl_divergence:.4f}  {p.target_prob:.3f}")
    # residual steering: the (Germany - France) difference read at the subject token, added there
    layer = n // 5
    v = contrastive_steering_vector(model, ["The capital of Germany is"], [prompt], layer,
                                    position=subject)
    res = SteeringSpec.residual([layer], v, positions=[subject])
    curve2 = dose_response(model, ids, res, [0.0, 0.25, 0.5, 0.75, 1.0], target=" Berlin")
    for p in curve2.points:
        print(f"  add {p.strength:.2f} x (Germany - France) at L{layer}, {toks[subject]!r}: "
              f"p(' Berlin') {p.target_prob:.3f}, top-1 {model.to_string([p.top_token])!r}")
    if out:
        from mi_core.util.plot import plot_dose_response
        print("wrote", plot_dose_response(curve, out))
    return {"attention_probs": curve.target_probs(), "berlin": curve2.target_probs(),
            "attention": [p.steered_attention for p in curve.points]}


if __name__ == "__main__":
    main(out="dose_response.png")
