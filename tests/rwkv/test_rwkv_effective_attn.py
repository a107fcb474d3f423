"""Effective attention: A @ v reproduces the WKV output before GroupNorm.

Tolerance: 1e-5 relative to the output's scale, max|A v - z| < 1e-5 * max(1, max|z|): in
F32 both sides round at ~1e-7 relative, and z reaches ~40 on these random weights.
"""

from __future__ import annotations

import torch

from tests.support.rwkv_ckpt import random_ids

import mi_core as mi


def _capture(model: mi.MIModel, ids: torch.Tensor, layer: int, hooks: mi.HookSpec | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = f"blocks.{layer}."
    spec = (hooks or mi.HookSpec()).capture(n + "rwkv.hook_effective_attn").capture(
        n + "attn.hook_v").capture(n + "attn.hook_z")
    c = model.forward(ids, spec)
    return c[n + "rwkv.hook_effective_attn"], c[n + "attn.hook_v"], c[n + "attn.hook_z"]


def test_effective_attention_times_values_reproduces_wkv_output(model: mi.MIModel) -> None:
    ids = random_ids(1, 19, seed=20)
    for layer in range(model.num_layers):
        a, v, z = _capture(model, ids, layer)
        assert a.shape == (1, model.num_heads, 19, 19)
        av = torch.einsum("bhts,bshd->bthd", a, v)
        assert (av - z).abs().max().item() < 1e-5 * max(1.0, z.abs().max().item())
        # causal: nothing above the diagonal
        assert a.triu(1).abs().max().item() == 0.0


def test_effective_attention_column_is_zero_after_knockout(model: mi.MIModel) -> None:
    ids = random_ids(1, 12, seed=21)
    ko = mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec(positions=[3]).layer(0))
    a, v, z = _capture(model, ids, 0, ko)
    below = a[:, :, 4:, 3]
    assert below.abs().max().item() == 0.0
    av = torch.einsum("bhts,bshd->bthd", a, v)
    assert (av - z).abs().max().item() < 1e-5 * max(1.0, z.abs().max().item())


def test_effective_attention_is_not_computed_unless_requested(model: mi.MIModel, monkeypatch) -> None:
    import mi_rwkv.v6 as v6
    import mi_rwkv.v7 as v7

    def boom(*args: object, **kw: object) -> None:
        raise AssertionError("effective attention computed without a request")

    monkeypatch.setattr(v6, "effective_attention_v6", boom)
    monkeypatch.setattr(v7, "effective_attention_v7", boom)
    model.forward(random_ids(1, 5), mi.HookSpec().capture("blocks.0.attn.hook_z"))
