"""``HookedRootModule`` / ``HookPoint`` from ``mi_core.tl`` run a custom hooked model as
TransformerLens' do (TransformerLens' Main Demo, "Hooking" section, on both classes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import mi_core as mi
from mi_core.tl import HookedRootModule, HookPoint

pytest.importorskip("transformer_lens")


def _model(root_cls, point_cls):
    class SquareThenAdd(nn.Module):
        def __init__(self, offset):
            super().__init__()
            self.offset = nn.Parameter(torch.tensor(offset))
            self.hook_square = point_cls()

        def forward(self, x):
            return self.offset + self.hook_square(x * x)

    class TwoLayerModel(root_cls):
        def __init__(self):
            super().__init__()
            self.layer1 = SquareThenAdd(3.0)
            self.layer2 = SquareThenAdd(-4.0)
            self.hook_in, self.hook_mid, self.hook_out = point_cls(), point_cls(), point_cls()
            self.setup()

        def forward(self, x):
            return self.hook_out(self.layer2(self.hook_mid(self.layer1(self.hook_in(x)))))

    return TwoLayerModel()


def _theirs():
    from transformer_lens.hook_points import HookPoint as TLHookPoint
    from transformer_lens.HookedRootModule import HookedRootModule as TLRoot

    return _model(TLRoot, TLHookPoint)


def test_custom_hooked_module_caches_and_intervenes_as_transformerlens():
    ours, theirs = _model(HookedRootModule, HookPoint), _theirs()
    assert list(ours.hook_dict) == list(theirs.hook_dict)
    out, cache = ours.run_with_cache(torch.tensor(5.0))
    tout, tcache = theirs.run_with_cache(torch.tensor(5.0))
    assert out.item() == tout.item() == 780.0
    assert {k: v.item() for k, v in cache.items()} == {k: v.item() for k, v in tcache.items()}
    assert list(cache) == list(tcache)
    names = []
    zero = (lambda t, hook: names.append(hook.name) or torch.tensor(0.0))
    for m in (ours, theirs):
        assert m.run_with_hooks(torch.tensor(5.0),
                                fwd_hooks=[("layer2.hook_square", zero)]).item() == -4.0
    assert names == ["layer2.hook_square"] * 2


def test_persistent_prepended_and_permanent_hooks():
    for m in (_model(HookedRootModule, HookPoint), _theirs()):
        order = []
        m.add_hook("hook_mid", lambda t, hook: order.append("a"))
        m.add_hook("hook_mid", lambda t, hook: order.append("b"), prepend=True)
        m.add_perma_hook("hook_mid", lambda t, hook: order.append("p"))
        m(torch.tensor(1.0))
        assert order == ["b", "a", "p"]
        m.reset_hooks()
        order.clear()
        m(torch.tensor(1.0))
        assert order == ["p"]
        m.reset_hooks(including_permanent=True)
        assert not m.hook_dict["hook_mid"].has_hooks()


def test_backward_hooks_and_bad_names():
    for m in (_model(HookedRootModule, HookPoint), _theirs()):
        grads = {}
        x = torch.tensor(2.0, requires_grad=True)
        def keep(g, hook):
            grads["g"] = g.item()

        m.add_hook("hook_mid", keep, dir="bwd")
        m(x).backward()
        assert grads["g"] == pytest.approx(2 * 7.0)  # d(mid^2 - 4)/d mid at mid = 7
        with pytest.raises(KeyError):
            m.add_hook("hook_nowhere", lambda t, hook: t)
    with pytest.raises(mi.HookError, match="hook_nowhere"):
        _model(HookedRootModule, HookPoint).add_hook("hook_nowhere", lambda t, hook: t)
    assert HookPoint().layer is not None  # a module, not the kernel's point name
    assert mi.HookPoint.parse("blocks.2.hook_resid_pre").layer == 2
