"""Generation with hooks: the same HookSpec applies at every step (prefill and each token).

    python examples/generation_with_hooks.py [MODEL]
"""

from __future__ import annotations

import mi_core as mi
from mi_core.interp import contrastive_steering_vector


def main(model: mi.MIModel | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    prompt = "The capital of France is"
    plain = model.generate(prompt, max_new_tokens=6)
    print(f"plain:   {prompt!r} -> {plain.text[0]!r}")
    toks = model.to_str_tokens(model.to_tokens(prompt)[0])
    subject = next(i for i, t in enumerate(toks) if "France" in t)
    layer = model.num_layers // 5
    v = contrastive_steering_vector(model, ["The capital of Germany is"], [prompt], layer,
                                    position=subject)

    def steer(x, hook):
        # prefill sees the whole prompt; later steps only the new token (KV cache)
        if x.shape[1] > subject:
            x = x.clone()
            x[:, subject] += v
        return x
    hooks = mi.HookSpec().intervene(mi.HookPoint.resid_pre(layer), steer)
    steered = model.generate(prompt, max_new_tokens=6, hooks=hooks)
    print(f"steered: {prompt!r} -> {steered.text[0]!r}  (+ (Germany - France) at L{layer}, "
          f"{toks[subject]!r})")
    counted = []
    counter = mi.HookSpec().intervene("blocks.0.hook_resid_pre",
                                      lambda x, hook: counted.append(x.shape[1]))
    model.generate(prompt, max_new_tokens=3, hooks=counter, stop_at_eos=False)
    print(f"hook at blocks.0.hook_resid_pre saw sequence lengths {counted} "
          "(prefill, then one token per step with the KV cache)")
    return {"plain": plain.text[0], "steered": steered.text[0], "calls": counted}


if __name__ == "__main__":
    main()
