"""The analysis layer on the real transformer backend: tiny random LLaMA (GQA, RMSNorm, no
biases) and StarCoder2 (LayerNorm with biases everywhere), made with `transformers`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    KnockoutSpec, LogitLensAnalysis, RecurrentPassSpec, SteeringSpec, apply_steering,
    attribution_patching, decompose_resid, direct_logit_attribution, forward_recurrent,
    knockout_hooks, logit_diff_metric, qk_circuit, run_for_decomposition, run_knockout,
    stack_head_results,
)

VOCAB = 128


def _make(root: Path, model_type: str, **over) -> mi.MIModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=64, **over)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # larger than HF's init so that nothing hides in tiny activations
        for name, p in hf.named_parameters():
            n = torch.randn(p.shape, generator=g)
            p.copy_(n if "embed" in name else (p + 0.1 * n if p.dim() == 1 else 0.1 * n))
    hf.save_pretrained(root / model_type)
    return mi.MIModel.from_pretrained(root / model_type)


@pytest.fixture(scope="module", params=["llama", "starcoder2"])
def tiny(request, tmp_path_factory):
    return _make(tmp_path_factory.mktemp("tiny"), request.param)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))


def test_decomposition_and_heads_sum_back(tiny, ids):
    cache = run_for_decomposition(tiny, ids, heads=True)
    stack, _ = decompose_resid(cache, tiny.num_layers)
    final = cache[mi.HookPoint.resid_post(tiny.num_layers - 1)]
    torch.testing.assert_close(stack.sum(0), final, atol=1e-4, rtol=0)
    for layer in range(tiny.num_layers):
        heads, _ = stack_head_results(tiny, cache, layers=[layer])
        torch.testing.assert_close(heads.sum(0), cache[mi.HookPoint.attn_out(layer)], atol=1e-4, rtol=0)


def test_dla_sums_to_the_logit_difference(tiny, ids):
    r = direct_logit_attribution(tiny, ids, token=5, incorrect=6, per_head=True)
    out = tiny.forward(ids).output[0, -1]
    assert r.total == pytest.approx(float(out[5] - out[6]), abs=1e-4)
    assert sum(r.values) + r.remainder == pytest.approx(r.total, abs=1e-4)


def test_lens_last_layer_is_the_output(tiny, ids):
    lens = LogitLensAnalysis(k=3).run(tiny, ids)
    out = tiny.forward(ids).output[0, -1]
    assert [t.token_id for t in lens.points[-1].top] == out.topk(3).indices.tolist()


def test_qk_circuit_reproduces_the_pre_rope_scores(tiny, ids):
    """q_i . k_j (hooks, pre-RoPE) == x_i^T (W_Q W_K^T) x_j with x the ln1 input / scale."""
    pts = ["blocks.1.hook_resid_pre", "blocks.1.ln1.hook_scale", "blocks.1.attn.hook_q",
           "blocks.1.attn.hook_k"]
    c = tiny.forward(ids, mi.HookSpec().capture_all(pts))
    x = c[pts[0]][0]
    norm = tiny.backend.config.norm_type
    if getattr(norm, "value", norm) != "rms":  # LayerNorm: centre first
        x = x - x.mean(-1, keepdim=True)
    xn = x / c[pts[1]][0]
    q, k = c[pts[2]][0], c[pts[3]][0]
    for h in (0, 3):
        want = q[:, h] @ k[:, h // 2].T
        try:
            b_q = tiny.backend.get_weight("b_Q", 1)
        except mi.MIError:
            b_q = None
        if b_q is not None:
            pytest.skip("q/k biases add affine terms the bilinear QK circuit leaves out")
        got = xn @ qk_circuit(tiny, 1, heads=[h], fold_ln=True).AB[0] @ xn.T
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_knockout_of_all_keys_and_steering_scale_zero(tiny, ids):
    spec = KnockoutSpec(from_positions=[-1])
    out = tiny.forward(ids, knockout_hooks(tiny, spec, ids.shape[1])).output
    assert torch.isfinite(out).all()
    ko = run_knockout(tiny, ids, KnockoutSpec(layers=[1], from_positions=[-1], to_positions=[0, 2]))
    st = apply_steering(tiny, ids, SteeringSpec.attention([1], [0, 2], [-1], scale=0.0))
    torch.testing.assert_close(st.steered_logits, ko.ablated_logits, atol=1e-4, rtol=0)


def test_attribution_patching_gradient_matches_finite_difference(tiny, ids):
    corr = ids.clone()
    corr[0, 3] = (corr[0, 3] + 1) % VOCAB
    metric = logit_diff_metric(5, 6)
    a = attribution_patching(tiny, ids, corr, metric, "resid_pre", layers=[2])
    hp = mi.HookPoint.resid_pre(2)
    ca = tiny.forward(ids, mi.HookSpec().capture(hp))[hp]
    ka = tiny.forward(corr, mi.HookSpec().capture(hp))[hp]
    eps = 1e-2
    step = torch.zeros_like(ca)
    step[:, 5] = eps * (ca - ka)[:, 5]
    m = float(metric(tiny.forward(corr, mi.HookSpec().intervene(hp, mi.Add(step))).output)[0])
    fd = (m - a.corrupted_metric) / eps / (a.clean_metric - a.corrupted_metric)
    assert float(a.grid[0, 5]) == pytest.approx(fd, abs=2e-2 * max(1.0, abs(fd)))


def test_recurrent_schedule_on_the_backend(tiny, ids):
    same = forward_recurrent(tiny, ids, RecurrentPassSpec(0, 1, extra_passes=0)).output
    torch.testing.assert_close(same, tiny.forward(ids).output)
    twice = forward_recurrent(tiny, ids, RecurrentPassSpec(1, 1, extra_passes=1)).output
    assert not torch.allclose(twice, same)
