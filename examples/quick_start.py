"""Quick start: load a model, run a prompt, capture activations, intervene, knock out
attention, generate. The README's quick start is this code.

    python examples/quick_start.py [MODEL]
"""

from __future__ import annotations

import mi_core as mi
from mi_core.interp import KnockoutSpec, run_knockout


def main(model: mi.MIModel | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    print(model)
    ids = model.to_tokens("The capital of France is")  # SmolLM2 adds no BOS token
    # capture the residual stream after layer 10 and the attention pattern of layer 5
    hooks = mi.HookSpec().capture(mi.HookPoint.resid_post(10)).capture("blocks.5.attn.hook_pattern")
    cache = model.forward(ids, hooks)
    top = cache.output[0, -1].softmax(-1).topk(5)
    print("top-5 next tokens:", [(model.to_string([int(i)]), round(float(p), 3))
                                 for p, i in zip(top.values, top.indices)])
    print("resid_post 10:", tuple(cache[mi.HookPoint.resid_post(10)].shape),
          " pattern 5:", tuple(cache["blocks.5.attn.hook_pattern"].shape))
    # intervene: zero the MLP output of layer 2 and see the prediction change
    ablated = model.forward(ids, mi.HookSpec().intervene("blocks.2.hook_mlp_out", mi.Zero()))
    kl = mi.kl_divergence(cache.output[0, -1], ablated.output[0, -1])
    print(f"KL after zeroing layer 2's MLP: {kl:.4f} nats")
    # knock out attention: the last token may not read position 3 in layers 8-15
    layers = range(model.num_layers // 4, model.num_layers // 2)
    r = run_knockout(model, ids, KnockoutSpec(layers=layers, from_positions=[-1], to_positions=[3]))
    answer = r.summary.baseline_top  # effects are knocked out - baseline
    print(f"knockout: KL {r.kl_divergence():.4f} nats, {answer.token!r} log p "
          f"{answer.logprob_diff:+.3f}")
    out = model.generate(ids, max_new_tokens=5)  # hooks=... applies a HookSpec at every step
    print("generated:", repr(out.text[0]))
    return {"top1": model.to_string([int(top.indices[0])]), "kl": kl,
            "knockout_logprob": answer.logprob_diff}


if __name__ == "__main__":
    main()
