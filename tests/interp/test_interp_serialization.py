"""Every spec and result type of the analysis layer round-trips through mi_core.serialize."""

from __future__ import annotations

import torch

from mi_core.interp import (
    CompositionScores, KnockoutSpec, RecurrentPassSpec, SteeringSpec, composition_scores,
)
from mi_core.serialize import from_json, to_json


def test_specs_round_trip():
    k = KnockoutSpec(layers=[1, 2], heads=[0], edges=[(3, 1)], from_positions=[-1])
    assert from_json(to_json(k), KnockoutSpec) == k
    s = SteeringSpec.residual([3], torch.arange(4.0), strength=0.5, positions=[2])
    back = from_json(to_json(s), SteeringSpec)
    torch.testing.assert_close(back.direction, s.direction)
    assert (back.kind, back.layers, back.from_positions, back.strength) == ("residual", (3,), (2,), 0.5)
    a = SteeringSpec.attention([0, 1], [0], [-1], heads=[2], value=0.3)
    assert from_json(to_json(a), SteeringSpec) == a
    r = RecurrentPassSpec(0, 1)
    assert from_json(to_json(r), RecurrentPassSpec) == r


def test_composition_scores_round_trip(model):
    c = composition_scores(model, "v")
    back = from_json(to_json(c), CompositionScores)
    torch.testing.assert_close(back.scores, c.scores)
    assert back.top(2) == c.top(2)
