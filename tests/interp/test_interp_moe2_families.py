"""Every analysis on gpt-oss (attention sinks), DeepSeek-V3 (latent attention) and Llama 4
(chunked attention, NoPE layers with temperature tuning): knockout, steering, logit lens,
patching, decomposition / DLA, the TransformerLens layer and process_weights (where it
applies, else a typed refusal).

Checkpoints: tests/support/tiny_families_moe2.py (transformers, random unit-scale weights).
Sums are checked to 1e-4 (F32).
"""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    KnockoutSpec, LogitLensAnalysis, SteeringSpec, apply_steering, decompose_resid,
    direct_logit_attribution, knockout_hooks, logit_diff_metric, patching_grid,
    run_for_decomposition, run_knockout, stack_head_results,
)
from tests.support.tiny_families_moe2 import cached_moe2

NAMES = ["gpt_oss", "deepseek_v3", "llama4_text"]


@pytest.fixture(scope="module")
def model_of(tmp_path_factory):
    get = cached_moe2(tmp_path_factory)
    models: dict[str, mi.MIModel] = {}

    def load(name: str) -> mi.MIModel:
        if name not in models:
            models[name] = mi.MIModel.from_pretrained(get(name).path)
        return models[name]

    return load


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", NAMES)
def test_decomposition_heads_and_dla_sum_back(model_of, ids, name):
    model = model_of(name)
    cache = run_for_decomposition(model, ids, heads=True)
    stack, _ = decompose_resid(cache, model.num_layers)
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    torch.testing.assert_close(stack.sum(0), final, atol=1e-4, rtol=0)
    for layer in range(model.num_layers):  # z @ W_O per head (MLA: v_head_dim wide)
        heads, _ = stack_head_results(model, cache, layers=[layer])
        torch.testing.assert_close(heads.sum(0), cache[mi.HookPoint.attn_out(layer)],
                                   atol=1e-4, rtol=0)
    r = direct_logit_attribution(model, ids, token=5, incorrect=6, per_head=True)
    out = model.forward(ids).output[0, -1]
    assert r.total == pytest.approx(float(out[5] - out[6]), abs=1e-4)
    assert sum(r.values) + r.remainder == pytest.approx(r.total, abs=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_logit_lens_last_layer_is_the_output(model_of, ids, name):
    model = model_of(name)
    lens = LogitLensAnalysis(k=3).run(model, ids)
    out = model.forward(ids).output[0, -1]
    assert [t.token_id for t in lens.points[-1].top] == out.topk(3).indices.tolist()


@pytest.mark.parametrize("name", NAMES)
def test_knockout_and_steering(model_of, ids, name):
    """Knocking out every key leaves finite logits; steering an edge to 0 equals knocking it
    out where rows renormalise to 1 (no sinks). With sinks, Steer's renormalisation to 1 drops
    the sink's share, so it differs from the knockout, which keeps the sink (docs/HOOKS.md)."""
    model = model_of(name)
    out = model.forward(ids, knockout_hooks(model, KnockoutSpec(from_positions=[-1]),
                                            ids.shape[1])).output
    assert torch.isfinite(out).all()
    ko = run_knockout(model, ids, KnockoutSpec(layers=[1], from_positions=[-1],
                                               to_positions=[0, 2]))
    st = apply_steering(model, ids, SteeringSpec.attention([1], [0, 2], [-1], scale=0.0))
    assert (ko.ablated_logits - model.forward(ids).output).abs().max().item() > 1e-4
    diff = (st.steered_logits - ko.ablated_logits).abs().max().item()
    if model.config.attn_sinks:
        assert diff > 1e-4
    else:
        assert diff < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_activation_patching_clean_into_corrupted_restores_clean(model_of, ids, name):
    model = model_of(name)
    corr = ids.clone()
    corr[0, 2] = (corr[0, 2] + 7) % 128
    metric = logit_diff_metric(5, 6)
    grid = patching_grid(model, ids, corr, metric, "resid_pre", layers=[0], positions=[2])
    assert grid.grid[0, 0].item() == pytest.approx(1.0, abs=1e-4)
    z = patching_grid(model, ids, corr, metric, "z", layers=[2])
    assert z.grid.shape == (1, model.num_heads) and torch.isfinite(z.grid).all()


def test_transformerlens_layer_on_each_family(model_of, ids):
    gpt = model_of("gpt_oss")
    logits, cache = gpt.run_with_cache(ids)
    torch.testing.assert_close(logits, gpt.forward(ids).output)
    assert cache["blocks.0.attn.hook_sinks"].shape == (gpt.num_heads,)
    # the sinks have no batch axis: TransformerLens' batch operations leave them alone
    one = cache.apply_slice_to_batch_dim(0)
    assert one["blocks.0.attn.hook_sinks"].shape == (gpt.num_heads,)
    assert one["blocks.0.hook_resid_pre"].shape == (9, 64)
    cache.remove_batch_dim()
    assert cache["blocks.0.attn.hook_sinks"].shape == (gpt.num_heads,)
    assert gpt.W_Q.shape == (3, 4, 64, 24) and gpt.W_O.shape == (3, 4, 24, 64)
    ds = model_of("deepseek_v3")
    logits, cache = ds.run_with_cache(ids)
    assert cache["blocks.1.attn.hook_kv_latent"].shape == (1, 9, 16)
    assert ds.W_O.shape == (3, 4, 12, 64)
    with pytest.raises(mi.WeightLoadError, match="latent attention"):
        ds.W_Q
    ll = model_of("llama4_text")
    _, cache = ll.run_with_cache(ids, names_filter=lambda n: "rot_q" in n)
    assert sorted(cache.keys()) == ["blocks.0.attn.hook_rot_q", "blocks.2.attn.hook_rot_q"]


@pytest.mark.parametrize("name", NAMES)
def test_process_weights_refuses_what_would_change_the_numbers_and_does_the_rest(
        tmp_path_factory, ids, name):
    """fold_ln is refused on MoE models and MLA, fold_value_biases with sinks and value
    biases (gpt-oss); what remains keeps the logits up to a per-position shift."""
    model = mi.MIModel.from_pretrained(cached_moe2(tmp_path_factory)(name).path)
    before = model.forward(ids).output
    with pytest.raises(mi.MIError, match="fold_ln"):
        model.process_weights()
    if name == "gpt_oss":
        with pytest.raises(mi.MIError, match="sinks"):
            model.process_weights(fold_ln=False, center_writing_weights=False)
    model.process_weights(fold_ln=False, center_writing_weights=False,
                          fold_value_biases=False)
    after = model.forward(ids).output
    shift = (after - before) - (after - before).mean(-1, keepdim=True)
    assert shift.abs().max().item() < 1e-4
