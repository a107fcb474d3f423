"""Hooks never alias (the kernel's rule, on the example plugin's toy backend): a capture is
the value at that point at that moment, and an in-place edit by a callable changes only its
own point, exactly as returning the edited tensor would. Transformer and RWKV backends:
tests/transformer/test_transformer_aliasing.py, tests/rwkv/test_rwkv_aliasing.py."""

from __future__ import annotations

import torch

import mi_core as mi
from mi_core.hooks import EditHookRun, GradHookRun, HookRun

from tests.support.inplace import inplace_edits_by_backend, inplace_mismatches


def _zero(t: torch.Tensor) -> None:
    t.zero_()


def test_every_point_of_the_toy_backend(toy_model, ids) -> None:
    assert not inplace_mismatches(toy_model, ids)
    assert inplace_edits_by_backend(toy_model, ids) == []


def test_the_issues_case_an_edit_at_resid_pre_keeps_the_captured_embedding(toy_model, ids):
    clean = toy_model.forward(ids, mi.HookSpec().capture("hook_embed"))["hook_embed"]
    spec = mi.HookSpec().capture("hook_embed").intervene("blocks.0.hook_resid_pre", _zero)
    cache = toy_model.forward(ids, spec)
    assert torch.equal(cache["hook_embed"], clean)
    assert cache["hook_embed"].abs().sum() > 0


def test_a_later_edit_anywhere_leaves_every_capture(toy_model, ids) -> None:
    """Capture everything, then zero the residual stream in place at the last layer."""
    points = toy_model.hook_points()
    ref = toy_model.forward(ids, mi.HookSpec().capture_all(points))
    cache = toy_model.forward(ids, mi.HookSpec().capture_all(points).intervene(
        "blocks.2.hook_resid_post", _zero))
    for p in points[:points.index(mi.HookPoint.parse("blocks.2.hook_resid_post"))]:
        assert torch.equal(cache[p], ref[p]), p.name


def test_callables_at_one_point_each_see_their_own_tensor(toy_model, ids) -> None:
    """Two callables at a point: the first keeps what it saw, the second zeroes in place;
    what the first kept is still the unedited value."""
    seen: list[torch.Tensor] = []
    spec = (mi.HookSpec().intervene("blocks.1.hook_mlp_out", lambda t: seen.append(t))
            .intervene("blocks.1.hook_mlp_out", _zero).capture("blocks.1.hook_mlp_out"))
    cache = toy_model.forward(ids, spec)
    ref = toy_model.forward(ids, mi.HookSpec().capture("blocks.1.hook_mlp_out"))
    assert torch.equal(seen[0], ref["blocks.1.hook_mlp_out"])
    assert cache["blocks.1.hook_mlp_out"].abs().sum() == 0


def test_no_copy_where_nothing_else_holds_the_tensor(toy_model, ids) -> None:
    """A callable whose tensor is fresh (mlp_out, after a Replace) gets that very tensor:
    copies are made only where an edit could reach another point."""
    got: dict[str, int] = {}
    spec = mi.HookSpec().intervene("blocks.0.hook_mlp_out", mi.Add(torch.ones(8)))
    spec.intervene("blocks.0.hook_mlp_out",
                   lambda t: got.update(ptr=t.untyped_storage().data_ptr()))
    spec.capture("blocks.0.hook_mlp_out")
    cache = toy_model.forward(ids, spec)
    assert got["ptr"] == cache["blocks.0.hook_mlp_out"].untyped_storage().data_ptr()


def test_runs_pay_for_copies_only_with_callables() -> None:
    """Capture-only and built-in interventions run the plain HookRun (no bookkeeping);
    a callable picks the copying run; gradients the gradient run (which copies too)."""
    assert type(mi.HookSpec().start()) is HookRun
    assert type(mi.HookSpec().capture("hook_embed").intervene("hook_embed", mi.Zero())
                .intervene("hook_embed", mi.Scale(2.0)).start()) is HookRun
    assert type(mi.HookSpec().intervene("hook_embed", _zero).start()) is EditHookRun
    assert isinstance(mi.HookSpec().capture_grad("hook_embed").start(), EditHookRun)
    assert type(mi.HookSpec().capture_grad("hook_embed").start()) is GradHookRun
