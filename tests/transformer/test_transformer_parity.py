"""F32 parity with transformers (eager attention) for every family, on tiny random checkpoints.

Reference: the same safetensors loaded by ``AutoModelForCausalLM`` (see conftest). Tolerance:
logits max abs diff < 1e-4 (the issue's bar); residual streams and patterns < 1e-4 as well.
"""

from __future__ import annotations

import pytest
import torch

import mi_core as mi

from tests.support.tiny_families import FAMILIES

TOL = 1e-4
SEQ = 16  # > WINDOW, so sliding-window layers really cut


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_matches_transformers_logits_resid_and_patterns(tiny, make_ids, name):
    t = tiny(name)
    model = t.load()
    ids = make_ids(2, SEQ, seed=1)
    with torch.no_grad():
        ref = t.hf(ids, output_hidden_states=True, output_attentions=True)
    L = model.num_layers
    hooks = mi.HookSpec().capture(mi.HookPoint.resid_pre(0)).capture("ln_final.hook_normalized")
    for i in range(L):
        hooks.capture(mi.HookPoint.resid_post(i)).capture(mi.HookPoint.attn_pattern(i))
    cache = model.forward(ids, hooks, allow_beyond_context=True)  # llama_dynamic_rope: on purpose

    assert (cache.output - ref.logits).abs().max().item() < TOL
    # hidden_states: [embeddings, after layer 0, ..., after layer L-2, final-normed output]
    # (token + learned position embeddings where the family has them)
    assert (cache[mi.HookPoint.resid_pre(0)] - ref.hidden_states[0]).abs().max().item() < TOL
    for i in range(L - 1):
        assert (cache[mi.HookPoint.resid_post(i)] - ref.hidden_states[i + 1]).abs().max() < TOL, i
    # ln_final.hook_normalized is x / scale before the gain (TransformerLens); HF's last
    # hidden state is the norm's full output
    final = model.backend.final_norm(cache[mi.HookPoint.resid_post(L - 1)])
    assert (final - ref.hidden_states[L]).abs().max().item() < TOL
    for i in range(L):
        assert (cache[mi.HookPoint.attn_pattern(i)] - ref.attentions[i]).abs().max() < TOL, i
    # the logits must actually vary, or the comparison above proves little
    assert cache.output.std().item() > 0.1


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma3_text", "qwen3", "phi3", "starcoder2"])
def test_sdpa_and_explicit_paths_agree(tiny, make_ids, name):
    model = tiny(name).load()
    ids = make_ids(2, SEQ, seed=2)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding on row 0 exercises the masked SDPA call
    for m in (None, mask):
        fast = model.forward(ids, attention_mask=m, attn_impl="sdpa").output
        slow = model.forward(ids, attention_mask=m, attn_impl="explicit").output
        assert (fast - slow).abs().max().item() < TOL


def test_softcapping_layers_always_take_the_explicit_path(tiny, make_ids):
    """SDPA cannot soft-cap; forcing "sdpa" on Gemma 2 must still give transformers' numbers."""
    t = tiny("gemma2")
    model = t.load()
    ids = make_ids(2, SEQ, seed=3)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (model.forward(ids, attn_impl="sdpa").output - ref).abs().max().item() < TOL


def test_capturing_the_pattern_does_not_change_the_logits(tiny, make_ids):
    model = tiny("mistral").load()
    ids = make_ids(2, SEQ, seed=4)
    plain = model.forward(ids).output
    hooks = mi.HookSpec().capture(mi.HookPoint.attn_pattern(1))
    assert (model.forward(ids, hooks).output - plain).abs().max().item() < 1e-5


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_bfloat16_error_is_no_worse_than_transformers_in_bfloat16(tiny, make_ids, name):
    """bf16 has ~3 significant digits, so the bar is relative: our bf16 logits are at most
    twice as far from the f32 reference as transformers' own bf16 forward is."""
    import copy

    from mi_core.registry import ModelSource
    from mi_transformer.loader import load_backend

    t = tiny(name)
    be = load_backend(ModelSource(path=t.path), torch.device("cpu"), torch.bfloat16)
    ids = make_ids(2, SEQ, seed=5)
    ours = mi.MIModel(be).forward(ids, mi.HookSpec().capture("blocks.0.attn.hook_pattern")).output
    with torch.no_grad():
        ref32 = t.hf(ids).logits
        ref16 = copy.deepcopy(t.hf).to(torch.bfloat16)(ids).logits
    assert ours.dtype == torch.bfloat16
    hf_err = (ref16.float() - ref32).abs().max().item()
    assert (ours.float() - ref32).abs().max().item() <= 2 * hf_err + 1e-3
