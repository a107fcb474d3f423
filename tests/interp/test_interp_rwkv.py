"""The backend-agnostic analyses on a real RWKV-7 backend (tiny random checkpoint, built with
the RWKV tests' writer): what needs only the residual stream works, what needs attention
points fails with a HookError naming the point."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    KnockoutSpec, LogitLensAnalysis, SteeringSpec, apply_ln_to_stack, apply_steering,
    decompose_resid, detect_heads, logit_diff_metric, patching_grid, run_for_decomposition,
    run_knockout,
)


@pytest.fixture(scope="module")
def rwkv(tmp_path_factory):
    from tests.support import rwkv_ckpt

    d = rwkv_ckpt.write_checkpoint(tmp_path_factory.mktemp("rwkv7"),
                                   rwkv_ckpt.v7_tensors(2, 128, 64, 300),
                                   rwkv_ckpt.v7_config(2, 128, 64, 300))
    return mi.MIModel.from_pretrained(d)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, 300, (1, 7), generator=torch.Generator().manual_seed(0))


def test_logit_lens_on_rwkv(rwkv, ids):
    lens = LogitLensAnalysis(k=3).run(rwkv, ids)
    out = rwkv.forward(ids).output[0, -1]
    assert len(lens.points) == rwkv.num_layers
    assert [t.token_id for t in lens.points[-1].top] == out.topk(3).indices.tolist()


def test_resid_patching_on_rwkv(rwkv, ids):
    corr = ids.clone()
    corr[0, 2] = (corr[0, 2] + 1) % 300
    out = rwkv.forward(ids).output[0, -1]
    metric = logit_diff_metric(int(out.argmax()), int(out.argmin()))
    r = patching_grid(rwkv, ids, corr, metric, "resid_pre", layers=[0])
    assert float(r.grid[0, 2]) == pytest.approx(1.0, abs=1e-4)
    assert r.grid[0, :2].abs().max() < 1e-4


def test_residual_steering_on_rwkv(rwkv, ids):
    # A random direction: the all-ones vector would be removed by every LayerNorm (no effect).
    direction = torch.randn(rwkv.hidden_size, generator=torch.Generator().manual_seed(1))
    r = apply_steering(rwkv, ids, SteeringSpec.residual([1], direction, 2.0))
    assert r.kl_divergence() > 1e-6


def test_decomposition_and_z_patching_work_where_rwkv_has_the_points(rwkv, ids):
    cache = run_for_decomposition(rwkv, ids)
    stack, _ = decompose_resid(cache, rwkv.num_layers)
    torch.testing.assert_close(stack.sum(0), cache[mi.HookPoint.resid_post(rwkv.num_layers - 1)],
                               atol=1e-4, rtol=0)
    # RWKV exposes ln_final.hook_scale and final_norm(scale=), so the stack goes through the
    # final LayerNorm linearly: components + norm(0) add up to the normalized final residual.
    normed = apply_ln_to_stack(rwkv, stack, cache)
    offset = rwkv.backend.final_norm(torch.zeros_like(stack[0]), scale=cache["ln_final.hook_scale"])
    final = rwkv.backend.final_norm(cache[mi.HookPoint.resid_post(rwkv.num_layers - 1)])
    torch.testing.assert_close(normed.sum(0) + offset, final, atol=1e-4, rtol=0)
    corr = ids.clone()
    corr[0, 2] = (corr[0, 2] + 1) % 300
    out = rwkv.forward(ids).output[0, -1]
    r = patching_grid(rwkv, ids, corr, logit_diff_metric(int(out.argmax()), int(out.argmin())), "z")
    assert r.grid.shape == (rwkv.num_layers, rwkv.num_heads) and torch.isfinite(r.grid).all()


def test_attention_analyses_name_the_missing_point(rwkv, ids):
    with pytest.raises(mi.HookError, match=r"attn\.hook_attn_scores.*rwkv|rwkv.*attn\.hook_attn_scores"):
        run_knockout(rwkv, ids, KnockoutSpec().edge(-1, 0))
    with pytest.raises(mi.HookError, match=r"attn\.hook_pattern"):
        detect_heads(rwkv, ids)
    with pytest.raises(mi.HookError, match=r"attn\.hook_pattern"):
        apply_steering(rwkv, ids, SteeringSpec.attention([0], to_positions=[0]))
