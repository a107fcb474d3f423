"""The grouped mixture-of-experts forward (mi_transformer.moe): stacked experts through
``torch.nn.functional.grouped_mm`` when nothing hooks an expert, the per-expert loop
otherwise, with the same numbers and the same hook semantics.

Reference: the per-expert loop itself (forced), transformers (tests/transformer/
test_transformer_moe.py), and the expert contributions the hooks capture.
"""

from __future__ import annotations

import attrs
import pytest
import torch
import torch.nn.functional as F

import mi_core as mi
from mi_transformer import moe as moe_mod

NAME = "qwen2_moe"  # 4 experts top-2, a gated shared expert, layer 1 dense


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = F.grouped_mm

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "grouped_mm", counted)
    return calls


def test_without_expert_hooks_the_experts_run_as_two_grouped_matmuls(loaded, make_ids,
                                                                       monkeypatch) -> None:
    model = loaded(NAME)
    calls = _counting(monkeypatch)
    ids = make_ids(2, 9, seed=1)
    model.forward(ids)
    sparse = sum(model.config.layer_moe)
    assert sparse >= 2 and len(calls) == 2 * sparse  # per MoE layer: gate_up and down
    calls.clear()
    model.forward(ids, mi.HookSpec().capture("blocks.0.mlp.hook_router_logits"))
    assert len(calls) == 2 * sparse  # router points do not need the per-expert view
    calls.clear()
    model.forward(ids, mi.HookSpec().capture("blocks.0.mlp.experts.1.hook_out"))
    assert len(calls) == 2 * sparse  # a hooked expert: its view is cut from the same rows


def test_capturing_expert_outputs_changes_no_bit_of_the_output(loaded, make_ids) -> None:
    model = loaded(NAME)
    ids = make_ids(2, 10, seed=2)
    pts = [f"blocks.0.mlp.experts.{e}.hook_out" for e in range(4)] + ["blocks.0.hook_mlp_out"]
    plain = model.forward(ids).output
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    assert torch.equal(cache.output, plain)
    total = sum(cache[p] for p in pts[:4])
    shared = model.forward(ids, mi.HookSpec().capture("blocks.0.mlp.shared_expert.hook_out"))
    total = total + shared["blocks.0.mlp.shared_expert.hook_out"]
    assert (total - cache["blocks.0.hook_mlp_out"]).abs().max().item() < 1e-5


def test_ablating_an_expert_removes_exactly_its_contribution(loaded, make_ids) -> None:
    model = loaded(NAME)
    ids = make_ids(2, 10, seed=3)
    e, p = 2, "blocks.0.mlp.experts.2.hook_out"
    base = model.forward(ids, mi.HookSpec().capture_all([p, "blocks.0.hook_mlp_out"]))
    assert base[p].abs().max().item() > 0
    spec = mi.HookSpec().intervene(p, lambda x, hook: torch.zeros_like(x))
    ablated = model.forward(ids, spec.capture("blocks.0.hook_mlp_out"))
    want = base["blocks.0.hook_mlp_out"] - base[p]
    assert (ablated["blocks.0.hook_mlp_out"] - want).abs().max().item() < 1e-6, e
    doubled = model.forward(ids, mi.HookSpec().intervene(p, lambda x, hook: x.mul_(2))
                            .capture("blocks.0.hook_mlp_out"))  # an in-place intervention
    want = base["blocks.0.hook_mlp_out"] + base[p]
    assert (doubled["blocks.0.hook_mlp_out"] - want).abs().max().item() < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_grouped_and_the_looped_forward_agree(tiny, make_ids, monkeypatch, dtype) -> None:
    model = mi.MIModel.from_pretrained(tiny("qwen3_moe").path, dtype=dtype)
    ids = make_ids(2, 11, seed=4)
    grouped = model.forward(ids).output.float()
    monkeypatch.setattr(moe_mod, "_grouped_ok", lambda w, x: False)
    looped = model.forward(ids).output.float()
    tol = 1e-5 if dtype == torch.float32 else 0.1 * looped.abs().max().item()
    assert (grouped - looped).abs().max().item() < tol


def test_the_loop_serves_float64_autograd_and_offloaded_blocks(tiny, make_ids,
                                                                monkeypatch) -> None:
    t = tiny("qwen3_moe")
    ids = make_ids(1, 8, seed=5)
    resident = mi.MIModel.from_pretrained(t.path)
    calls = _counting(monkeypatch)
    want = resident.forward(ids).output
    assert calls
    calls.clear()
    offloaded = mi.MIModel.from_pretrained(t.path, offload="cpu")
    assert offloaded.backend.w.layers[0].mlp.stacked is None  # no stack copy per forward
    assert (offloaded.forward(ids).output - want).abs().max().item() < 1e-5
    f64 = mi.MIModel.from_pretrained(t.path, dtype=torch.float64)
    assert (f64.forward(ids).output - want.double()).abs().max().item() < 1e-4
    w = resident.backend.w.layers[0].mlp
    x = torch.randn(3, resident.hidden_size, requires_grad=True)
    assert not moe_mod._grouped_ok(w, x)  # grouped_mm's CPU backward fails on empty groups
    assert moe_mod._grouped_ok(w, x.detach())
    assert not calls


def test_stacked_experts_are_views_edited_in_place_and_cannot_be_rebound(tiny,
                                                                          make_ids) -> None:
    model = mi.MIModel.from_pretrained(tiny("qwen3_moe").path)
    mlp = model.backend.w.layers[0].mlp
    gate_up, down = mlp.stacked
    expert = mlp.experts[1]
    assert expert.w_gate.data_ptr() == gate_up[1].data_ptr()
    assert expert.w_up.data_ptr() == gate_up[1, gate_up.shape[1] // 2:].data_ptr()
    ids = make_ids(2, 9, seed=6)
    p = "blocks.0.mlp.experts.1.hook_out"
    before = model.forward(ids, mi.HookSpec().capture(p))
    assert before[p].abs().max().item() > 0
    with torch.no_grad():
        expert.w_down.zero_()  # reaches the grouped forward through the stack
    assert (model.forward(ids).output - before.output).abs().max().item() > 1e-3
    assert model.forward(ids, mi.HookSpec().capture(p))[p].abs().max().item() == 0
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        expert.w_down = torch.zeros_like(expert.w_down)
