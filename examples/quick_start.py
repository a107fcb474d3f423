"""Quick start: load a model, run a prompt, capture activations, intervene.

    python examples/quick_start.py [MODEL]
"""

from __future__ import annotations


import mi_core as mi


def main(model: mi.MIModel | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    print(model)
    ids = model.to_tokens("The capital of France is")
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
    return {"top1": model.to_string([int(top.indices[0])]), "kl": kl}


if __name__ == "__main__":
    main()
