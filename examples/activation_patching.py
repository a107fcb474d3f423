"""Activation patching on an IOI-style prompt pair: which heads move the indirect object?

    python examples/activation_patching.py [MODEL]

Clean "When John and Mary went to the store, John gave a drink to" (answer " Mary") vs the
corrupted prompt with the second "John" replaced by "Mary" (answer " John"); the metric is
logit(" Mary") - logit(" John"), normalised so 0 = corrupted and 1 = clean. Attribution
patching (one forward + one backward) scores every head; exact patching then checks the
layers it points to, and a residual-stream grid shows the information moving from the
repeated name to the last token.
"""

from __future__ import annotations

import torch

import mi_core as mi
from mi_core.interp import attribution_patching, logit_diff_metric, patching_grid

CLEAN = "When John and Mary went to the store, John gave a drink to"
CORRUPT = "When John and Mary went to the store, Mary gave a drink to"


def main(model: mi.MIModel | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    enc = lambda s: model.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    mary, john = enc(" Mary")[0], enc(" John")[0]
    metric = logit_diff_metric(mary, john)
    approx = attribution_patching(model, CLEAN, CORRUPT, metric, kind="z")
    print(f"metric clean {approx.clean_metric:.3f}, corrupted {approx.corrupted_metric:.3f}")
    print("attribution patching, top heads:",
          ", ".join(f"L{l}{c} {v:+.2f}" for l, c, v in approx.top(5)))
    layers = sorted({l for l, _, _ in approx.top(3)})
    exact = patching_grid(model, CLEAN, CORRUPT, metric, kind="z", layers=layers)
    print("exact patching, same layers:   ",
          ", ".join(f"L{l}{c} {v:+.2f}" for l, c, v in exact.top(5)))
    rows = [approx.layers.index(l) for l in layers]
    corr = float(torch.corrcoef(torch.stack([exact.grid.flatten(),
                                             approx.grid[rows].flatten()]))[0, 1])
    print(f"correlation of attribution and exact patching on those layers: {corr:.3f}")
    n = model.num_layers
    resid = patching_grid(model, CLEAN, CORRUPT, metric, kind="resid_pre",
                          layers=[0, n // 3, 2 * n // 3, n - 1], positions=[9, -1])
    for i, layer in enumerate(resid.layers):
        print(f"resid_pre L{layer:<2}: " + "  ".join(f"{c} {float(v):+.2f}"
                                                 for c, v in zip(resid.columns, resid.grid[i])))
    return {"top_head": exact.top(1)[0], "correlation": corr, "resid": resid.grid.tolist()}


if __name__ == "__main__":
    main()
