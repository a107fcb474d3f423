"""Induction heads: on a random token sequence repeated twice, which heads attend from each
token in the second half to the token after its first occurrence?

    python examples/induction_heads.py [MODEL]
"""

from __future__ import annotations

import torch

import mi_core as mi
from mi_core.interp import detect_heads, repeated_random_tokens


def main(model: mi.MIModel | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    ids = repeated_random_tokens(model, length=20, batch=4, seed=0)
    r = detect_heads(model, ids)
    for kind in ("induction", "previous_token", "duplicate_token"):
        print(f"{kind:>15}: " + ", ".join(f"L{l}H{h} {s:.2f}" for l, h, s in r.top(kind, 5)))
    # the model predicts the second half far better than the first: in-context copying
    logp = torch.log_softmax(model.forward(ids).output.float(), -1)
    tok_lp = logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    half = (ids.shape[1] - 1) // 2
    first, second = float(-tok_lp[:, :half].mean()), float(-tok_lp[:, half:].mean())
    print(f"loss on the first copy {first:.2f}, on the repeat {second:.2f} nats/token")
    return {"top": r.top("induction", 3), "loss_first": first, "loss_second": second}


if __name__ == "__main__":
    main()
