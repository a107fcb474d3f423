"""Recurrent passes against a hand-run layer schedule of the fake backend."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    RecurrentFeedbackEntry, RecurrentPassSpec, forward_recurrent, generate_recurrent,
)
from mi_core.serialize import from_json, to_json


def _by_hand(model, ids, layers, inject=None):
    """Reference: call the fake backend's layers directly in the given order."""
    be = model.backend
    run = mi.HookSpec().start()
    x = be.W_E[ids]
    for step, layer in enumerate(layers):
        x = be._layer(layer, x, run)
        if inject is not None and step in inject:
            x = x.clone()
            x[:, -1] += inject[step]
    return be.project_to_vocab(x)


def test_schedule_and_feedback_steps():
    spec = RecurrentPassSpec(1, 2, extra_passes=2)
    assert spec.schedule(4) == [0, 1, 2, 1, 2, 1, 2, 3]
    assert spec.feedback_steps() == {2, 4}


def test_no_extra_pass_equals_the_plain_forward(model):
    ids = model.to_tokens("loop")
    out = forward_recurrent(model, ids, RecurrentPassSpec(0, 1, extra_passes=0)).output
    torch.testing.assert_close(out, model.forward(ids).output)


def test_rerun_block_with_feedback_matches_hand_run(model):
    ids = model.to_tokens("loop")
    v = torch.randn(model.hidden_size)
    spec = RecurrentPassSpec(1, 1, extra_passes=1, feedback=[RecurrentFeedbackEntry(v, 0.5)])
    out = forward_recurrent(model, ids, spec).output
    ref = _by_hand(model, ids, [0, 1, 1, 2], inject={1: 0.5 * v})
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    assert not torch.allclose(out, model.forward(ids).output)


def test_generate_recurrent(model):
    ids = model.to_tokens("gen")
    plain = model.generate(ids, max_new_tokens=4)
    same = generate_recurrent(model, ids, RecurrentPassSpec(0, 0, extra_passes=0), 4)
    assert same.new_tokens.tolist() == plain.new_tokens.tolist()
    spec = RecurrentPassSpec(0, 1, extra_passes=1)
    g = generate_recurrent(model, ids, spec, 3)
    # reference: greedy decoding with the hand-run schedule
    cur = ids
    for _ in range(3):
        nxt = _by_hand(model, cur, spec.schedule(3))[:, -1].argmax(-1)
        cur = torch.cat([cur, nxt[:, None]], 1)
    assert g.tokens.tolist() == cur.tolist()
    once = generate_recurrent(model, ids, RecurrentPassSpec(0, 1, 1, sustained=False), 3)
    assert once.new_tokens[0, 0] == g.new_tokens[0, 0]


def test_bad_specs(model):
    with pytest.raises(mi.HookError, match="layer 7"):
        forward_recurrent(model, "a", RecurrentPassSpec(0, 7))
    with pytest.raises(mi.InterventionError, match="after its end"):
        forward_recurrent(model, "a", RecurrentPassSpec(2, 1))
    with pytest.raises(mi.InterventionError, match="d_model"):
        forward_recurrent(model, "a", RecurrentPassSpec(0, 1, feedback=[RecurrentFeedbackEntry(torch.ones(3))]))


def test_spec_round_trips_json():
    spec = RecurrentPassSpec(1, 2, 1, [RecurrentFeedbackEntry(torch.ones(4), 2.0, -2)], False)
    back = from_json(to_json(spec), RecurrentPassSpec)
    assert back.loop_end == 2 and back.feedback[0].position == -2 and not back.sustained
    torch.testing.assert_close(back.feedback[0].vector, torch.ones(4))
