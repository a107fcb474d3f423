"""Checks that hooks never alias, for any backend: an in-place edit at a point changes only
that point (exactly as returning the edited tensor would), and a capture is a snapshot.

:func:`inplace_mismatches` runs, for every hook point, the same forward (capturing every
point) twice: once with a callable that edits its tensor in place and returns None, once with
one that returns the same edit as a new tensor; logits, every capture and the backend's
extras (a recurrent state) must be bitwise equal. :func:`inplace_edits_by_backend` records
every tensor a backend hands to ``run.apply`` (and what comes back) with its PyTorch version
counter, and reports those edited in place afterwards (none may be: only callables edit).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import pytest
import torch

import mi_core as mi
from mi_core.hooks import HookRun


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread (a loaded 2-core machine makes more much slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _in_place(t: torch.Tensor) -> None:
    """x * 0.5 + 0.125 (exact, keeps -inf masks, positive scales and decays in (0, 1)); an
    integer tensor (MoE expert indices) reversed along its last axis (top-k slots swapped)."""
    if t.is_floating_point():
        t.mul_(0.5).add_(0.125)
    else:
        t.copy_(t.flip(-1))


def _out_of_place(t: torch.Tensor) -> torch.Tensor:
    return t * 0.5 + 0.125 if t.is_floating_point() else t.flip(-1)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and \
            bool(torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                       and torch.equal(a.nan_to_num(), b.nan_to_num())))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return True


def inplace_mismatches(model: mi.MIModel, ids: torch.Tensor,
                       points: Iterable[mi.HookPoint] | None = None,
                       extras: Callable[[mi.HookCache], Any] | None = None,
                       options: Callable[[], dict[str, Any]] | None = None) -> list[str]:
    """For each point, what differs between the in-place and the out-of-place edit there
    (logits, which captures, the extras); empty when hooks never alias. `options()` gives
    each forward its own options (e.g. a fresh copy of a carried state)."""
    pts = list(points) if points is not None else model.hook_points()
    everything = model.hook_points()
    bad = []
    for p in pts:
        runs = []
        for fn in (_in_place, _out_of_place):
            spec = mi.HookSpec().capture_all(everything).intervene(p, fn)
            cache = model.forward(ids, spec, **(options() if options else {}))
            runs.append((cache, extras(cache) if extras else None))
        (a, xa), (b, xb) = runs
        diff = [n for n in a.keys() if not _same(a[n], b[n])]
        if not _same(a.output, b.output):
            diff.insert(0, "logits")
        if not _same(xa, xb):
            diff.append("extras")
        if diff:
            bad.append(f"{p.name}: {', '.join(diff[:6])}{' ...' if len(diff) > 6 else ''}")
    return bad


def edit_changes_something(model: mi.MIModel, ids: torch.Tensor, point: mi.HookLike) -> bool:
    """Whether the test's edit at `point` changes the logits at all (so that comparing the
    in-place and out-of-place edits there can fail)."""
    base = model.forward(ids).output
    edited = model.forward(ids, mi.HookSpec().intervene(point, _out_of_place)).output
    return not torch.equal(base, edited)


def inplace_edits_by_backend(model: mi.MIModel, ids: torch.Tensor,
                             spec: mi.HookSpec | None = None, **forward: Any) -> list[str]:
    """Points whose tensor (handed to ``run.apply`` or returned by it) the backend edited in
    place after the call, found by PyTorch's version counters (the forward runs with grad
    mode on, outside inference mode, where tensors have them)."""
    seen: list[tuple[str, torch.Tensor, int]] = []
    original = HookRun.apply

    def recording(self: HookRun, name: str, x: torch.Tensor) -> torch.Tensor:
        out = original(self, name, x)
        seen.extend([(name, x, x._version), (name, out, out._version)])
        return out

    HookRun.apply = recording  # type: ignore[method-assign]
    try:
        with torch.enable_grad():
            model.forward(ids, spec if spec is not None else
                          mi.HookSpec().capture_all(model.hook_points()), **forward)
    finally:
        HookRun.apply = original  # type: ignore[method-assign]
    return sorted({name for name, t, v in seen if t._version != v})
