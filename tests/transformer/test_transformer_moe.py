"""Mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) against transformers.

Reference: the tiny random checkpoints of tests/support/tiny_families.py loaded by
transformers (eager attention, F32). Tolerance: max abs diff < 1e-4 for logits, residual
streams, patterns and router logits; routing indices exactly equal.
"""

from __future__ import annotations

import copy

import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, InterventionError
from mi_transformer.config import parse_config
from tests.support.family_checks import assert_left_padding_rows_alone, assert_matches_transformers

TOL = 1e-4
MOE = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]


@pytest.mark.parametrize("name", MOE)
def test_moe_family_matches_transformers(tiny, make_ids, name):
    assert_matches_transformers(tiny(name), make_ids(2, 16, seed=21))


@pytest.mark.parametrize("name", MOE)
def test_moe_left_padding_rows_equal_running_alone(loaded, make_ids, name):
    assert_left_padding_rows_alone(loaded(name), [make_ids(1, 13, seed=5)[0],
                                                  make_ids(1, 7, seed=6)[0]])


@pytest.mark.parametrize("name", MOE)
def test_router_points_equal_transformers_router(tiny, loaded, make_ids, name):
    """hook_router_logits equals transformers' router_logits (pre-softmax); the indices and
    weights equal top-k of its softmax, renormalised exactly when the family says so."""
    t, model = tiny(name), loaded(name)
    ids = make_ids(2, 12, seed=22)
    with torch.no_grad():
        ref = t.hf(ids, output_router_logits=True).router_logits  # per MoE layer [b*s, E]
    moe_layers = [i for i, f in enumerate(model.config.layer_moe) if f]
    assert len(ref) == len(moe_layers)
    pts = [f"blocks.{i}.mlp.hook_{k}" for i in moe_layers
           for k in ("router_logits", "expert_weights", "expert_indices")]
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    c = model.config.moe
    for i, r in zip(moe_layers, ref):
        logits = cache[f"blocks.{i}.mlp.hook_router_logits"]
        assert logits.shape == (2, 12, c.num_experts)
        assert (logits.reshape(-1, c.num_experts) - r).abs().max().item() < TOL
        w, idx = torch.topk(torch.softmax(r.float(), -1), c.top_k, dim=-1)
        if c.norm_topk_prob:
            w = w / w.sum(-1, keepdim=True)
        assert torch.equal(cache[f"blocks.{i}.mlp.hook_expert_indices"].reshape(-1, c.top_k), idx)
        got_w = cache[f"blocks.{i}.mlp.hook_expert_weights"].reshape(-1, c.top_k)
        assert (got_w - w).abs().max().item() < 1e-6
        sums = got_w.sum(-1)
        if c.norm_topk_prob:
            assert torch.allclose(sums, torch.ones_like(sums), atol=1e-6)
        else:
            assert sums.max().item() < 1 - 1e-3  # without renormalisation the mass is < 1


@pytest.mark.parametrize("name", ["qwen2_moe", "mixtral"])
def test_expert_outputs_sum_to_the_mlp_output_and_are_zero_where_not_routed(loaded, make_ids,
                                                                            name):
    model = loaded(name)
    c = model.config.moe
    i = 0
    pts = [f"blocks.{i}.mlp.experts.{e}.hook_out" for e in range(c.num_experts)]
    pts += [f"blocks.{i}.hook_mlp_out", f"blocks.{i}.mlp.hook_expert_indices"]
    shared = c.shared_expert_size > 0
    if shared:
        pts.append(f"blocks.{i}.mlp.shared_expert.hook_out")
    ids = make_ids(2, 10, seed=23)
    plain = model.forward(ids).output
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    assert (cache.output - plain).abs().max().item() < 1e-6  # capturing changes nothing
    idx = cache[f"blocks.{i}.mlp.hook_expert_indices"]
    total = torch.zeros_like(cache[f"blocks.{i}.hook_mlp_out"])
    for e in range(c.num_experts):
        out = cache[f"blocks.{i}.mlp.experts.{e}.hook_out"]
        routed = (idx == e).any(-1)  # [b, s]
        assert out.shape == (2, 10, model.hidden_size)
        assert torch.all(out[~routed] == 0), e
        assert routed.any() and out[routed].abs().amax(-1).min().item() > 0, e
        total = total + out
    if shared:
        total = total + cache[f"blocks.{i}.mlp.shared_expert.hook_out"]
    assert (total - cache[f"blocks.{i}.hook_mlp_out"]).abs().max().item() < 1e-5


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen2_moe"])
def test_intervening_on_router_logits_changes_routing_like_a_changed_router(tiny, loaded,
                                                                           make_ids, name):
    """Negating the router logits of every MoE layer equals transformers with every router
    weight negated: the routing really follows the intervened logits."""
    t, model = tiny(name), loaded(name)
    ids = make_ids(2, 12, seed=24)
    moe_layers = [i for i, f in enumerate(model.config.layer_moe) if f]
    spec = mi.HookSpec()
    for i in moe_layers:
        spec.intervene(f"blocks.{i}.mlp.hook_router_logits", lambda x, hook: -x)
        spec.capture(f"blocks.{i}.mlp.hook_expert_indices")
    ours = model.forward(ids, spec)
    before = model.forward(ids, mi.HookSpec().capture_all(
        [f"blocks.{i}.mlp.hook_expert_indices" for i in moe_layers]))
    ref_model = copy.deepcopy(t.hf)
    with torch.no_grad():
        for layer in ref_model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "weight") and gate.weight.shape[0] == \
                    model.config.moe.num_experts:
                gate.weight.neg_()
        ref = ref_model(ids).logits
    assert (ours.output - ref).abs().max().item() < TOL
    i = moe_layers[0]
    key = f"blocks.{i}.mlp.hook_expert_indices"
    assert not torch.equal(ours[key], before[key])  # routing did change
    assert (ours.output - before.output).abs().max().item() > 1e-2


def test_dense_layers_of_a_sparse_model_keep_the_dense_mlp_points(loaded):
    """Qwen2-MoE's mlp_only_layers: layer 1 is a plain gated MLP (mlp.hook_pre, no router)."""
    model = loaded("qwen2_moe")
    names = {p.name for p in model.hook_points()}
    assert "blocks.1.mlp.hook_pre" in names and "blocks.1.mlp.hook_router_logits" not in names
    assert "blocks.0.mlp.hook_router_logits" in names and "blocks.0.mlp.hook_pre" not in names
    assert "blocks.0.mlp.shared_expert.hook_out" in names
    assert "blocks.0.mlp.experts.3.hook_out" in names


def test_expert_index_intervention_out_of_range_is_an_intervention_error(loaded, make_ids):
    model = loaded("mixtral")
    spec = mi.HookSpec().intervene("blocks.0.mlp.hook_expert_indices",
                                   lambda x, hook: torch.full_like(x, 7))
    with pytest.raises(InterventionError, match="hook_expert_indices"):
        model.forward(make_ids(1, 4, seed=1), spec)


def test_forcing_an_expert_through_the_indices_runs_that_expert(loaded, make_ids):
    """Replacing the indices sends every token to experts 0 and 1: their hook_out is non-zero
    everywhere and the other experts' is zero."""
    model = loaded("mixtral")
    pts = [f"blocks.0.mlp.experts.{e}.hook_out" for e in range(4)]
    spec = mi.HookSpec().intervene(
        "blocks.0.mlp.hook_expert_indices",
        lambda x, hook: torch.tensor([0, 1]).expand_as(x).contiguous()).capture_all(pts)
    cache = model.forward(make_ids(2, 6, seed=2), spec)
    for e in range(4):
        nonzero = cache[pts[e]].abs().amax(-1) > 0
        assert bool(nonzero.all()) == (e < 2) and bool(nonzero.any()) == (e < 2), e


@pytest.mark.parametrize("bad, match", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"num_local_experts": 5}, "disagree"),
    ({"norm_topk_prob": "yes"}, "norm_topk_prob"),
    ({"mlp_only_layers": [7]}, "mlp_only_layers"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size"),
])
def test_malformed_moe_config_is_a_config_error_naming_the_key(tiny, bad, match):
    cfg = {**tiny("qwen3_moe").config, "num_experts": 8}
    cfg.update(bad)
    with pytest.raises(ConfigError, match=match):
        parse_config(cfg)


def test_dense_mlp_weights_of_an_moe_layer_are_a_weight_load_error(loaded):
    from mi_core.errors import WeightLoadError

    model = loaded("qwen2_moe")
    with pytest.raises(WeightLoadError, match="mixture-of-experts"):
        model.backend.get_weight("W_in", 0)
    assert model.backend.get_weight("W_in", 1).shape == (model.hidden_size, 96)  # dense layer
