"""Hooks never alias on the transformer backend: at every hook point of families with
different layouts, an in-place edit changes only that point and captures are snapshots.

Families: LLaMA (sequential, grouped-query), GPT-NeoX (parallel block, two norms, partial
rotary), Falcon 7B-style (parallel block with one shared norm, multi-query), GPT-2 (learned
positions: ``hook_rot_q`` is a view of ``hook_q``), OLMo2 (no pre-norms: ``attn.hook_in`` is
the residual stream), Gemma 2 (post-norms, soft-capping), Qwen2-MoE (experts, a shared
expert, a dense layer), Hunyuan (q/k norms after the rotation), GLM-4.5 (sigmoid group-limited
routing, shared experts, a dense first layer) and EXAONE-4 (sliding and full layers, no
pre-norms). All 51 tiny families of tests/support passed the same check once (2026-11-24);
these ten are the distinct layouts kept in the suite. Before the fix an in-place edit at
``hook_mlp_in`` rewrote the residual stream and one at ``hook_resid_pre`` the captured
``hook_embed``.
"""

from __future__ import annotations

import pytest
import torch

import mi_core as mi

from tests.support.inplace import (  # noqa: F401  (one_torch_thread is a fixture)
    edit_changes_something, inplace_edits_by_backend, inplace_mismatches, one_torch_thread,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILIES = ["llama", "gpt_neox", "falcon_7b", "gpt2", "olmo2", "gemma2", "qwen2_moe",
            "hunyuan_v1_dense", "glm4_moe", "exaone4"]


def _zero(t: torch.Tensor) -> None:
    t.zero_()


def _double(t: torch.Tensor) -> None:
    t.mul_(2.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_inplace_edit_at_any_point_equals_returning_it(loaded, make_ids, family) -> None:
    model = loaded(family)
    bad = inplace_mismatches(model, make_ids(2, 6, seed=1))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_the_edit_used_changes_the_logits_at_the_points_that_aliased(loaded, make_ids,
                                                                       family) -> None:
    """The comparison above can fail: the edit really changes the model's output at the
    points that used to write through (so a write-through would show in the logits)."""
    model, ids = loaded(family), make_ids(2, 6, seed=1)
    for p in ("blocks.0.hook_mlp_in", "blocks.1.hook_resid_pre", "blocks.0.attn.hook_in"):
        assert edit_changes_something(model, ids, p), p


def test_inplace_edit_at_mlp_in_leaves_the_residual_stream(loaded, make_ids) -> None:
    """The issue's case: zeroing ``hook_mlp_in`` in place zeroes the MLP's input only."""
    model, ids = loaded("llama"), make_ids(1, 5)
    spec = mi.HookSpec().capture("blocks.0.hook_resid_mid").capture("blocks.0.hook_resid_post")
    clean = model.forward(ids, spec)
    zeroed = model.forward(ids, spec.copy().intervene("blocks.0.hook_mlp_in", _zero))
    assert torch.equal(zeroed["blocks.0.hook_resid_mid"], clean["blocks.0.hook_resid_mid"])
    # resid_post = resid_mid + mlp(ln2(0)): the residual survives, only the MLP input changed
    assert not torch.equal(zeroed["blocks.0.hook_resid_post"], clean["blocks.0.hook_resid_post"])
    assert zeroed["blocks.0.hook_resid_post"].abs().sum() > 0


def test_inplace_edit_at_resid_pre_leaves_the_captured_embedding(loaded, make_ids) -> None:
    model, ids = loaded("llama"), make_ids(1, 5)
    clean = model.forward(ids, mi.HookSpec().capture("hook_embed"))["hook_embed"]
    spec = mi.HookSpec().capture("hook_embed").intervene("blocks.0.hook_resid_pre", _zero)
    assert torch.equal(model.forward(ids, spec)["hook_embed"], clean)


def test_a_callable_that_keeps_its_tensor_keeps_a_snapshot(loaded, make_ids) -> None:
    """A callable that stores the tensor it saw (TransformerLens-style caching) is not
    changed by a later in-place edit elsewhere."""
    model, ids = loaded("llama"), make_ids(1, 5)
    kept: dict[str, torch.Tensor] = {}
    spec = (mi.HookSpec().intervene("blocks.0.hook_resid_post", lambda t: kept.update(a=t))
            .intervene("blocks.1.hook_resid_pre", _zero))
    model.forward(ids, spec)
    ref = model.forward(ids, mi.HookSpec().capture("blocks.0.hook_resid_post"))
    assert torch.equal(kept["a"], ref["blocks.0.hook_resid_post"])


def test_between_layers_editing_in_place_leaves_captures(loaded, make_ids) -> None:
    model, ids = loaded("llama"), make_ids(1, 5)
    last = model.num_layers - 1
    point = f"blocks.{last}.hook_resid_post"
    ref = model.forward(ids, mi.HookSpec().capture(point))[point]
    got = model.forward(ids, mi.HookSpec().capture(point),  # doubles it after the capture
                        between_layers=lambda step, layer, x: x.mul_(2.0) if layer == last else x)
    assert torch.equal(got[point], ref)


@pytest.mark.parametrize("family", ["olmo2", "cohere_qk_norm"])
def test_hook_attn_in_runs_with_kv_head_norms_on_grouped_query_models(loaded, make_ids,
                                                                      family) -> None:
    """Found by the every-point test: an intervention at ``hook_attn_in`` of a GQA model
    whose k norm has gains per KV head (OLMo2's full-width norm, Cohere's per-head
    LayerNorms) crashed; keys per query head now take their KV head's gains, so a no-op
    edit there gives the plain forward (to float rounding of the per-head einsum)."""
    model, ids = loaded(family), make_ids(2, 6)
    assert model.num_kv_heads < model.num_heads
    plain = model.forward(ids).output
    spec = mi.HookSpec().intervene("blocks.1.hook_attn_in", lambda t: t + 0.0)
    torch.testing.assert_close(model.forward(ids, spec).output, plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "falcon_7b", "gpt2", "qwen2_moe"])
def test_the_backend_never_edits_a_hooked_tensor_in_place(loaded, make_ids, family) -> None:
    """Audit by version counters: no tensor handed to run.apply (or returned by it) is edited
    in place by the forward afterwards, capturing every point or none, with a KV cache too."""
    model, ids = loaded(family), make_ids(2, 6)
    assert inplace_edits_by_backend(model, ids) == []
    assert inplace_edits_by_backend(model, ids, mi.HookSpec()) == []
    past = model.backend.new_past(2)
    assert inplace_edits_by_backend(model, ids, past=past) == []
    assert inplace_edits_by_backend(model, ids[:, :1], past=past) == []


def test_gradient_runs_copy_for_inplace_callables_too(loaded, make_ids) -> None:
    model, ids = loaded("llama"), make_ids(1, 5)
    spec = (mi.HookSpec().capture("hook_embed").capture_grad("blocks.0.hook_resid_pre")
            .intervene("blocks.0.hook_resid_pre", _double))
    cache = model.forward(ids, spec)
    cache.output.sum().backward()
    clean = model.forward(ids, mi.HookSpec().capture("hook_embed"))["hook_embed"]
    assert torch.equal(cache["hook_embed"].detach(), clean)
    assert cache.grad("blocks.0.hook_resid_pre").abs().sum() > 0


def test_an_inplace_edit_at_the_sinks_leaves_the_weights(tmp_path_factory, make_ids) -> None:
    """gpt-oss hands its sink logits (a weight) to ``attn.hook_sinks``: an in-place edit there
    changes that forward only, never the model (found by the every-point check; DeepSeek's
    MLA and Llama 4 passed it too)."""
    from tests.support.tiny_families_moe2 import cached_moe2

    model = cached_moe2(tmp_path_factory)("gpt_oss").load()
    ids = make_ids(2, 6, seed=1)
    sinks = [p for p in model.hook_points() if p.suffix == "attn.hook_sinks"]
    before = model.forward(ids).output
    assert not inplace_mismatches(model, ids, sinks)
    assert torch.equal(model.forward(ids).output, before)
