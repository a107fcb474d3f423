"""Recurrent feedback ("anacrousis"): run a block of layers twice and inject a direction
between the passes, at prefill and during generation.

    python examples/recurrent_feedback.py [MODEL]
"""

from __future__ import annotations

import mi_core as mi
from mi_core.interp import contrastive_steering_vector


def main(model: mi.MIModel | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    prompt = "The capital of France is"
    ids = model.to_tokens(prompt)
    n = model.num_layers
    start, end = n // 2, n // 2 + 3
    base = model.forward(ids).output[0, -1]
    plain_block = mi.RecurrentPassSpec(start, end, extra_passes=1)
    out = mi.forward_recurrent(model, ids, plain_block).output[0, -1]
    print(f"layers {start}-{end} run twice: top-1 {model.to_string([int(out.argmax())])!r} "
          f"(KL from the normal pass {mi.kl_divergence(base, out):.3f})")
    toks = model.to_str_tokens(ids[0])
    subject = next(i for i, t in enumerate(toks) if "France" in t)
    # feedback: the (Germany - France) difference at the block's output, at the subject token
    v = contrastive_steering_vector(model, ["The capital of Germany is"], [prompt], end + 1,
                                    position=subject)
    spec = mi.RecurrentPassSpec(start, end, extra_passes=1, sustained=True,
                                feedback=[mi.RecurrentFeedbackEntry(v, scale=1.0, position=subject)])
    g = mi.generate_recurrent(model, ids, spec, max_new_tokens=4)
    plain = model.generate(ids, max_new_tokens=4)
    print(f"generation, normal:                 {plain.text[0]!r}")
    print(f"generation, block re-run + feedback: {g.text[0]!r}")
    return {"recurrent_top1": model.to_string([int(out.argmax())]), "text": g.text[0]}


if __name__ == "__main__":
    main()
