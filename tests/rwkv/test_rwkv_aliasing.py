"""Hooks never alias on RWKV-6 and RWKV-7: at every hook point an in-place edit changes only
that point (the carried recurrent state included) and captures are snapshots; the backend
edits no hooked tensor in place (version counters)."""

from __future__ import annotations

import torch

from tests.support.inplace import inplace_edits_by_backend, inplace_mismatches
from tests.support.rwkv_ckpt import random_ids


def _state(cache) -> list[torch.Tensor]:
    s = cache.extra["state"]
    return [*s.att_shift, *s.wkv, *s.ffn_shift]


def test_an_inplace_edit_at_any_point_equals_returning_it(model) -> None:
    bad = inplace_mismatches(model, random_ids(2, 5, seed=3), extras=_state)
    assert not bad, "\n".join(bad)


def test_an_inplace_edit_after_a_carried_state_equals_returning_it(model) -> None:
    """One token after a state (generation): the state hook, the token shift."""
    ids = random_ids(1, 4, seed=4)
    prefix = model.backend.new_past(1)
    model.forward(ids[:, :3], past=prefix)
    points = [p for p in model.hook_points() if p.layer in (None, 1)]
    bad = inplace_mismatches(model, ids[:, 3:], points, extras=_state,
                             options=lambda: {"past": prefix.clone()})
    assert not bad, "\n".join(bad)


def test_the_backend_never_edits_a_hooked_tensor_in_place(model) -> None:
    ids = random_ids(2, 5)
    assert inplace_edits_by_backend(model, ids) == []
    past = model.backend.new_past(2)
    assert inplace_edits_by_backend(model, ids, past=past) == []
    assert inplace_edits_by_backend(model, ids[:, :1], past=past) == []
