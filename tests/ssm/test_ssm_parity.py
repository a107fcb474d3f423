"""Mamba, Falcon-Mamba and Mamba-2 against transformers on the same tiny weights (its CPU torch
path): logits and every layer's residual stream < 1e-4 (F32), a left-padded batch of 2,
state-cached greedy generation, and token-by-token == sequence mode."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi

from tests.support.ssm_tiny import ssm_ids

TOL = 1e-4


def test_logits_and_every_layers_residual_stream_match_transformers(family, tiny_ssm,
                                                                     ssm_model) -> None:
    t, model = tiny_ssm(family), ssm_model(family)
    ids = ssm_ids(2, 21, seed=1)
    with torch.no_grad():
        ref = t.hf(ids, output_hidden_states=True)
    L = model.num_layers
    cache = model.forward(ids, mi.HookSpec().capture_all(mi.HookPoint.resid_post(i)
                                                         for i in range(L)))
    assert (cache.output - ref.logits).abs().max().item() < TOL
    # transformers' hidden_states of these families: after each layer, then the final norm
    for i in range(L):
        diff = (cache[mi.HookPoint.resid_post(i)] - ref.hidden_states[i]).abs().max().item()
        assert diff < TOL, (i, diff)
    assert cache.output.std().item() > 0.5  # unit scale: the comparison is not of zeros
    assert model.layer_types == [{"mamba2": "mamba2"}.get(family, "mamba")] * L


def test_left_padded_batch_matches_transformers_and_each_row_alone(family, tiny_ssm,
                                                                   ssm_model) -> None:
    t, model = tiny_ssm(family), ssm_model(family)
    ids = ssm_ids(2, 14, seed=2)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # row 1: 5 pads on the left
    ids[1, :5] = 0
    with torch.no_grad():
        ref = t.hf(ids, attention_mask=mask).logits
    out = model.forward(ids, attention_mask=mask).output
    assert (out[0] - ref[0]).abs().max().item() < TOL
    assert (out[1, 5:] - ref[1, 5:]).abs().max().item() < TOL
    alone = model.forward(ids[1:, 5:]).output
    assert (out[1, 5:] - alone[0]).abs().max().item() < TOL


def test_state_cached_greedy_generation_equals_transformers_tokens(family, tiny_ssm,
                                                                   ssm_model) -> None:
    t, model = tiny_ssm(family), ssm_model(family)
    ids = ssm_ids(2, 9, seed=3)
    with torch.no_grad():  # transformers' own state cache (DynamicCache of conv/ssm states)
        ref = t.hf.generate(ids, max_new_tokens=10, do_sample=False)
    out = model.generate(ids, max_new_tokens=10).tokens
    # after EOS transformers pads with pad_token_id and we repeat EOS: compare up to it
    eos = t.hf.config.eos_token_id
    for row in range(2):
        gen, theirs = out[row, 9:].tolist(), ref[row, 9:].tolist()
        n = gen.index(eos) + 1 if eos in gen else len(gen)
        assert gen[:n] == theirs[:n], (row, gen, theirs)
    assert torch.equal(out[:, :9], ref[:, :9])


def test_left_padded_batched_generation_equals_each_row_alone(ssm_model) -> None:
    model = ssm_model("mamba")
    ids = ssm_ids(2, 8, seed=8)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ids[0, :3] = 0
    batch = model.generate(ids, max_new_tokens=6, attention_mask=mask, stop_at_eos=False)
    for row, start in ((0, 3), (1, 0)):
        alone = model.generate(ids[row:row + 1, start:], max_new_tokens=6, stop_at_eos=False)
        assert torch.equal(batch.tokens[row, 8:], alone.tokens[0, 8 - start:])


def test_token_by_token_with_the_state_equals_the_sequence(family, ssm_model) -> None:
    model = ssm_model(family)
    ids = ssm_ids(2, 11, seed=4)
    full = model.forward(ids).output
    past = model.backend.new_past(2)
    steps = [model.forward(ids[:, :4], past=past).output]
    steps += [model.forward(ids[:, j:j + 1], past=past).output for j in range(4, 11)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < TOL


def test_right_padding_then_cached_tokens_equal_the_row_alone(ssm_model) -> None:
    """Pads anywhere are skipped by the convolution and leave the state as it was."""
    model = ssm_model("mamba2")
    ids = ssm_ids(2, 10, seed=5)
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0  # row 0: 4 pads on the right, then more tokens through the cache
    past = model.backend.new_past(2)
    model.forward(ids, attention_mask=mask, past=past)
    more = ssm_ids(2, 3, seed=6)
    out = model.forward(more, past=past).output
    alone = model.forward(torch.cat([ids[:1, :6], more[:1]], dim=1)).output
    assert (out[0] - alone[0, 6:]).abs().max().item() < TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_half_precision_is_no_worse_than_transformers_in_the_same_dtype(
        family, tiny_ssm, ssm_model, dtype: torch.dtype) -> None:
    """Half precision has ~3 significant digits: against our F32 logits, our half-precision
    logits are as close as transformers' own forward in that dtype (mean error within 10%,
    max error within 2x, the bar of the transformer families). The scan runs in F32 on both
    sides; the residual stream is F32 where residual_in_fp32 says so."""
    from transformers import AutoModelForCausalLM

    t = tiny_ssm(family)
    ids = ssm_ids(2, 24, seed=7)
    exact = ssm_model(family).forward(ids).output
    hf = AutoModelForCausalLM.from_pretrained(t.path, dtype=dtype).eval()
    with torch.no_grad():
        theirs = (hf(ids).logits.float() - exact).abs()
    ours = (mi.MIModel.from_pretrained(t.path, dtype=dtype).forward(ids).output.float()
            - exact).abs()
    assert ours.mean().item() <= 1.1 * theirs.mean().item() + 1e-4, (ours.mean(), theirs.mean())
    assert ours.max().item() <= 2 * theirs.max().item() + 1e-3
