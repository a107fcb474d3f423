"""The hybrid families against transformers on the same tiny weights (its CPU torch path):
logits and every layer's residual stream < 1e-4 (F32), a left-padded batch of 2 (transformers'
hybrids zero the mixer's input at pads and mask attention, so their rows are padding-invariant
too), state/KV-cached greedy generation, token by token == the sequence, layer types."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi

from tests.support.hybrid_tiny import HYBRID_FAMILIES, HYBRID_LAYER_TYPES, hybrid_model, \
    tiny_hybrid
from tests.support.ssm_tiny import ssm_ids

TOL = 1e-4


@pytest.fixture(params=sorted(HYBRID_FAMILIES))
def hybrid(request: pytest.FixtureRequest) -> str:
    return request.param


def test_logits_and_every_layers_residual_stream_match_transformers(hybrid) -> None:
    t, model = tiny_hybrid(hybrid), hybrid_model(hybrid)
    ids = ssm_ids(2, 21, seed=1)
    with torch.no_grad():
        ref = t.hf(ids, output_hidden_states=True)
    L = model.num_layers
    cache = model.forward(ids, mi.HookSpec().capture_all(mi.HookPoint.resid_pre(i)
                                                         for i in range(L)))
    assert (cache.output - ref.logits).abs().max().item() < TOL
    # transformers' hidden_states: the embedding, then each layer's output (the last one
    # after the final norm), i.e. hidden_states[i] = resid_pre(i) for i < L
    for i in range(L):
        diff = (cache[mi.HookPoint.resid_pre(i)] - ref.hidden_states[i]).abs().max().item()
        assert diff < TOL, (i, diff)
    # unit scale (Granite's logits_scaling 2 halves them): the comparison is not of zeros
    assert cache.output.std().item() > 0.3
    assert model.layer_types == HYBRID_LAYER_TYPES[hybrid]


def test_left_padded_batch_matches_transformers_and_each_row_alone(hybrid) -> None:
    t, model = tiny_hybrid(hybrid), hybrid_model(hybrid)
    ids = ssm_ids(2, 14, seed=2)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # row 1: 5 pads on the left
    ids[1, :5] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as transformers' generate passes them
    with torch.no_grad():
        ref = t.hf(ids, attention_mask=mask, position_ids=positions).logits
    out = model.forward(ids, attention_mask=mask).output
    assert (out[0] - ref[0]).abs().max().item() < TOL
    assert (out[1, 5:] - ref[1, 5:]).abs().max().item() < TOL
    alone = model.forward(ids[1:, 5:]).output
    assert (out[1, 5:] - alone[0]).abs().max().item() < TOL


def test_cached_greedy_generation_equals_transformers_tokens(hybrid) -> None:
    t, model = tiny_hybrid(hybrid), hybrid_model(hybrid)
    ids = ssm_ids(2, 9, seed=3)
    with torch.no_grad():  # transformers' own cache (KV for attention, conv/ssm states)
        ref = t.hf.generate(ids, max_new_tokens=10, do_sample=False)
    out = model.generate(ids, max_new_tokens=10).tokens
    eos = t.hf.config.eos_token_id
    for row in range(2):
        gen, theirs = out[row, 9:].tolist(), ref[row, 9:].tolist()
        n = gen.index(eos) + 1 if eos in gen else len(gen)
        assert gen[:n] == theirs[:n], (row, gen, theirs)


def test_token_by_token_with_the_cache_equals_the_sequence(hybrid) -> None:
    model = hybrid_model(hybrid)
    ids = ssm_ids(2, 11, seed=4)
    full = model.forward(ids).output
    past = model.backend.new_past(2)
    steps = [model.forward(ids[:, :4], past=past).output]
    steps += [model.forward(ids[:, j:j + 1], past=past).output for j in range(4, 11)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < TOL


@pytest.mark.parametrize("name", ["jamba", "nemotron_h", "granitemoehybrid"])
def test_bfloat16_is_no_worse_than_transformers_in_bfloat16(name: str) -> None:
    """Against our F32 logits, our bf16 logits are as close as transformers' own bf16 forward
    (mean error within 10%, max within 2x: the bar of the other families); the scans run in
    F32 on both sides.

    32 x 24 tokens: with MoE layers (Jamba, Granite 4.0-H) a token whose router logits are
    within bf16's rounding of a tie goes to another expert in either bf16 forward, and on
    2 x 24 tokens one such flip decided the mean: Granite measured 1.21x at these ids
    (ours flipped two near-ties, F32 margins 0.0016 and 0.0071 against a router error of
    0.022; transformers one), 0.64-1.33x over 20 other id draws, median 1.005x; at 32 x 24
    Granite 1.00x, Jamba 0.94x, Nemotron-H 1.08x."""
    from transformers import AutoModelForCausalLM

    t = tiny_hybrid(name)
    ids = ssm_ids(32, 24, seed=7)
    exact = hybrid_model(name).forward(ids).output
    hf = AutoModelForCausalLM.from_pretrained(t.path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        theirs = (hf(ids).logits.float() - exact).abs()
    ours = (mi.MIModel.from_pretrained(t.path, dtype=torch.bfloat16).forward(ids).output.float()
            - exact).abs()
    assert ours.mean().item() <= 1.1 * theirs.mean().item() + 1e-4, (ours.mean(), theirs.mean())
    assert ours.max().item() <= 2 * theirs.max().item() + 1e-3
