"""Recurrent state: token-by-token == sequence mode, generation, padding, state knockout /
steering semantics, and the result classes."""

from __future__ import annotations

import torch

from tests.support.rwkv_ckpt import random_ids

import mi_core as mi
from mi_core.serialize import from_json, to_json
from mi_rwkv import StateAblationResult, StateSteeringResult, run_state_knockout, run_state_steering


def test_token_by_token_with_carried_state_equals_sequence_mode(model: mi.MIModel) -> None:
    ids = random_ids(2, 8, seed=4)
    seq = model.forward(ids).output
    past = model.backend.new_past(2)
    steps = [model.forward(ids[:, t:t + 1], past=past).output for t in range(ids.shape[1])]
    assert (torch.cat(steps, dim=1) - seq).abs().max().item() < 1e-4


def test_two_chunks_of_a_sequence_equal_one_call(model: mi.MIModel) -> None:
    ids = random_ids(1, 24, seed=5)
    seq = model.forward(ids).output
    past = model.backend.new_past(1)
    a = model.forward(ids[:, :13], past=past).output
    b = model.forward(ids[:, 13:], past=past).output
    assert (torch.cat([a, b], dim=1) - seq).abs().max().item() < 1e-4


def test_generate_uses_the_state_and_matches_recomputation(model: mi.MIModel) -> None:
    ids = random_ids(1, 6, seed=6)
    res = model.generate(ids, max_new_tokens=5, stop_at_eos=False)
    # Greedy continuation recomputed from scratch, one full forward per step.
    cur = ids
    for _ in range(5):
        nxt = model.forward(cur).output[:, -1].argmax(-1, keepdim=True)
        cur = torch.cat([cur, nxt], dim=1)
    assert torch.equal(res.tokens, cur)


def test_left_padding_gives_the_unpadded_logits(model: mi.MIModel) -> None:
    ids = random_ids(1, 9, seed=7)
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 9, dtype=torch.long)], dim=1)
    out = model.forward(padded, attention_mask=mask).output[:, 4:]
    assert (out - model.forward(ids).output).abs().max().item() < 1e-4


def _attn_out_after(model: mi.MIModel, ids: torch.Tensor, layer: int, p: int, knockout: bool,
                    perturb: bool) -> torch.Tensor:
    """blocks.{layer}.hook_attn_out at positions > p, with token p's key and value at `layer`
    optionally replaced by noise."""
    hooks = mi.HookSpec().capture(f"blocks.{layer}.hook_attn_out")
    if perturb:
        g = torch.Generator().manual_seed(9)

        def noise(t: torch.Tensor, hook: mi.HookPoint) -> torch.Tensor:
            t = t.clone()
            t[:, p] = torch.randn(t[:, p].shape, generator=g) * 3
            return t

        hooks.intervene(f"blocks.{layer}.attn.hook_k", noise).intervene(f"blocks.{layer}.attn.hook_v", noise)
    if knockout:
        hooks.set_state_knockout(mi.StateKnockoutSpec(positions=[p]).layer(layer))
    return model.forward(ids, hooks)[f"blocks.{layer}.hook_attn_out"][:, p + 1:]


def test_knockout_makes_later_positions_independent_of_the_tokens_key_value(model: mi.MIModel) -> None:
    ids = random_ids(1, 12, seed=8)
    for layer in range(model.num_layers):
        ko_a = _attn_out_after(model, ids, layer, 4, knockout=True, perturb=False)
        ko_b = _attn_out_after(model, ids, layer, 4, knockout=True, perturb=True)
        assert (ko_a - ko_b).abs().max().item() < 1e-5
        # Without the knockout the same perturbation does move them (the test can fail).
        free_a = _attn_out_after(model, ids, layer, 4, knockout=False, perturb=False)
        free_b = _attn_out_after(model, ids, layer, 4, knockout=False, perturb=True)
        assert (free_a - free_b).abs().max().item() > 1e-2


def test_steering_scale_zero_equals_knockout_and_one_is_a_no_op(model: mi.MIModel) -> None:
    ids = random_ids(1, 10, seed=10)
    base = model.forward(ids).output
    ko = model.forward(ids, mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec(positions=[2, 5]))).output
    s0 = model.forward(ids, mi.HookSpec().set_state_steering(mi.StateSteeringSpec(0.0, positions=[2, 5]))).output
    s1 = model.forward(ids, mi.HookSpec().set_state_steering(mi.StateSteeringSpec(1.0, positions=[2, 5]))).output
    assert (ko - s0).abs().max().item() < 1e-6
    assert (s1 - base).abs().max().item() < 1e-6
    assert (ko - base).abs().max().item() > 1e-3
    # Positions before the first knocked-out token are untouched (v7 reads S_t, which
    # includes token t's own write, so position 2 itself may move).
    assert (ko[:, :2] - base[:, :2]).abs().max().item() < 1e-5


def test_knockout_wins_over_steering_where_both_apply(model: mi.MIModel) -> None:
    ids = random_ids(1, 10, seed=11)
    ko = mi.StateKnockoutSpec(positions=[3]).layer(1)
    both = mi.HookSpec().set_state_knockout(ko).set_state_steering(
        mi.StateSteeringSpec(5.0, positions=[3]).layer(1))
    only = mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec(positions=[3]).layer(1))
    assert (model.forward(ids, both).output - model.forward(ids, only).output).abs().max().item() < 1e-6


def test_state_results_report_kl_and_round_trip_json(model: mi.MIModel) -> None:
    ids = random_ids(1, 8, seed=12)
    ab = run_state_knockout(model, ids, mi.StateKnockoutSpec(positions=[1]))
    assert ab.kl_divergence() > 1e-4 and ab.kl_divergence(0) < 1e-9  # position 0 precedes it
    back = from_json(to_json(ab), StateAblationResult)
    assert torch.allclose(back.intervened_logits, ab.intervened_logits) and back.positions == [1]
    st = run_state_steering(model, ids, mi.StateSteeringSpec(2.0, positions=[1]).layer(0))
    assert st.kl_divergence() > 0
    # the one metric convention (intervened - baseline), against the logits themselves
    t = int(ab.baseline_logits[0, -1].argmax())
    b, a = ab.baseline_logits[0, -1].double(), ab.intervened_logits[0, -1].double()
    assert abs(ab.logit_diff(t) - float(a[t] - b[t])) < 1e-5
    assert abs(ab.logprob_diff(t) - float(a.log_softmax(-1)[t] - b.log_softmax(-1)[t])) < 1e-5
    assert abs(ab.prob_diff(t) - float(a.softmax(-1)[t] - b.softmax(-1)[t])) < 1e-6
    assert from_json(to_json(st), StateSteeringResult).scale == 2.0


def test_state_hook_captures_final_state_and_intervention_changes_the_carried_state(
        model: mi.MIModel) -> None:
    ids = random_ids(1, 7, seed=13)
    past = model.backend.new_past(1)
    cache = model.forward(ids, mi.HookSpec().capture("blocks.1.rwkv.hook_state"), past=past)
    h, d = model.num_heads, model.config.head_dim
    assert cache["blocks.1.rwkv.hook_state"].shape == (1, h, d, d)
    assert torch.equal(cache["blocks.1.rwkv.hook_state"], past.wkv[1])
    zeroed = model.backend.new_past(1)
    model.forward(ids, mi.HookSpec().intervene("blocks.1.rwkv.hook_state", mi.Zero()), past=zeroed)
    assert zeroed.wkv[1].abs().max().item() == 0.0 and zeroed.wkv[0].abs().max().item() > 0


def test_knockout_position_outside_the_sequence_is_an_error(model: mi.MIModel) -> None:
    import pytest

    with pytest.raises(mi.InterventionError, match="position 20"):
        model.forward(random_ids(1, 5), mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec(positions=[20])))


def test_bf16_forward_runs_and_stays_close_to_f32(v7_dir, v7_model: mi.MIModel) -> None:
    ids = random_ids(1, 10, seed=14)
    bf = mi.MIModel.from_pretrained(v7_dir, dtype=torch.bfloat16)
    out = bf.forward(ids).output.float()
    ref = v7_model.forward(ids).output
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert (out - ref).abs().max().item() < 0.25 * ref.abs().max().item()


def test_generation_with_state_knockout_uses_absolute_positions(model: mi.MIModel) -> None:
    ids = random_ids(1, 6, seed=15)
    hooks = mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec(positions=[2]))
    res = model.generate(ids, max_new_tokens=4, hooks=hooks, stop_at_eos=False, return_logits=True)
    cur = ids
    for step in range(4):
        logits = model.forward(cur, hooks).output[:, -1]
        assert (logits - res.step_logits[step]).abs().max().item() < 1e-4
        cur = torch.cat([cur, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(res.tokens, cur)
