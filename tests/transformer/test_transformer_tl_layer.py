"""The TransformerLens layer (``mi_core.tl.HookedTransformer``) on families beyond the demos'
SmolLM2 and GPT-2: its forwards use TransformerLens' arithmetic (mi_core.tl.arithmetic:
norms dividing by the scale, explicit attention, TransformerLens' rotary tables where the
RoPE is plain) and its parameters carry gradients (components.WeightTree.autograd). Whatever
the rotary kind (halves, GPT-J pairs, partial, scaled, q/k norms, NoPE layers, soft caps),
the logits equal the kernel's (transformers' arithmetic) to F32 rounding (1e-4 absolute on
these unit-scale models), greedy generation gives the kernel's tokens, and backward() reaches
every parameter that takes part in the forward (a Gemma norm's stored w does not: the forward
reads the gain 1 + w made at load, so the census at load detaches it)."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.tl import HookedTransformer

#: plain RoPE (halves / GPT-J pairs / partial), parallel blocks, soft caps and two bases,
#: q/k norms before and after the rotation, NoPE layers, scaled RoPE, learned positions
FAMILIES = ["llama", "gptj", "gpt_neox", "phi", "gemma2", "qwen3", "hunyuan_v1_dense",
            "smollm3", "llama3_rope", "gpt2"]
#: the families whose rotation TransformerLens' default tables describe (emulated)
PLAIN_ROPE = {"llama", "gptj", "gpt_neox", "phi", "gemma2", "qwen3", "smollm3"}


@pytest.mark.parametrize("family", FAMILIES)
def test_tl_layer_equals_the_kernel_and_reaches_every_weight(tiny, make_ids, family):
    model = HookedTransformer.from_pretrained_no_processing(tiny(family).path)
    assert bool(model._rotary) == (family in PLAIN_ROPE)
    ids = make_ids(2, 12)
    with torch.no_grad():
        ours = model(ids)
        kernel = model.mi_model.run_with_hooks(ids)
    assert (ours - kernel).abs().max().item() < 1e-4
    if family == "gemma2":
        w = model.blocks[0].ln1.w
        assert not w.requires_grad
        saved = w.detach().clone()
        with torch.no_grad():
            w += 1.0
        with pytest.raises(mi.CapabilityError, match="ln1.w was edited"):
            model(ids)
        with torch.no_grad():
            w.copy_(saved)
    greedy = model.generate(ids[:1, :6], max_new_tokens=4, do_sample=False,
                            stop_at_eos=False, verbose=False)
    ref = model.mi_model.generate(ids[:1, :6], max_new_tokens=4, stop_at_eos=False)
    assert torch.equal(greedy[0, 6:], ref.tokens[0, 6:])
    loss = model(ids, return_type="loss")
    assert loss.grad_fn is not None
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    tied = model.W_U.T.data_ptr() == model.W_E.data_ptr()
    assert missing == (["unembed.W_U"] if tied else [])  # tied: the gradient goes to W_E
