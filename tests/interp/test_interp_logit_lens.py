"""Logit lens against a hand-computed projection and the model's own output."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.interp import LogitLensAnalysis, LogitLensResult
from mi_core.serialize import from_json, to_json


def test_last_layer_lens_equals_the_model_output(model):
    ids = model.to_tokens("the cat sat")
    r = LogitLensAnalysis(k=3).run(model, ids)
    out = model.forward(ids).output[0, -1]
    probs = torch.softmax(out, -1)
    last = r.points[-1]
    assert last.top[0].token_id == int(out.argmax())
    assert last.top[0].prob == pytest.approx(float(probs.max()), abs=1e-5)
    assert last.top[0].logit == pytest.approx(float(out.max()), abs=1e-4)


def test_each_point_is_the_final_norm_and_unembedding_of_that_residual(model):
    ids = model.to_tokens("abc")
    r = LogitLensAnalysis(k=2, include_mid=True, targets=[5, 7]).run(model, ids, position=1)
    assert [p.label for p in r.points] == ["L0.mid", "L0", "L1.mid", "L1", "L2.mid", "L2"]
    be = model.backend
    cache = model.forward(ids, mi.HookSpec().capture("blocks.1.hook_resid_mid"))
    x = cache["blocks.1.hook_resid_mid"][0, 1]
    ref = (x / (x.pow(2).mean() + be.config.eps).sqrt() * be.ln_final_w) @ be.W_U  # RMSNorm by hand
    p = r.points[2]
    assert p.top[0].token_id == int(ref.argmax())
    t5 = p.targets[0]
    assert t5.token_id == 5 and t5.rank == int((ref > ref[5]).sum())
    assert t5.prob == pytest.approx(float(torch.softmax(ref, -1)[5]), abs=1e-6)


def test_result_round_trips_json_and_formats(model):
    r = LogitLensAnalysis(k=2, targets=["a"]).run(model, "xy")
    back = from_json(to_json(r), LogitLensResult)
    assert back == r
    assert "L2" in r.format_table()
    assert r.target_trajectory(r.points[0].targets[0].token_id)[0][0] == "L0"


def test_position_out_of_range_and_unknown_target(model):
    with pytest.raises(mi.InterventionError, match="position 9 out of range"):
        LogitLensAnalysis().run(model, "ab", position=9)
    with pytest.raises(mi.TokenizerError, match="expected exactly one"):
        LogitLensAnalysis(targets=["abc"]).run(model, "ab")


def test_mid_points_need_resid_mid(rwkv_like):
    assert len(LogitLensAnalysis().run(rwkv_like, "ab").points) == rwkv_like.num_layers
    with pytest.raises(mi.HookError, match="hook_resid_mid"):
        LogitLensAnalysis(include_mid=True).run(rwkv_like, "ab")
