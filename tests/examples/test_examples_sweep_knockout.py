"""examples/sweep_knockout.py, reduced to 2 prompts (60 conditions), on SmolLM2: the
interrupted sweep resumes where it stopped and its conditions equal run_knockout's
(max abs diff < 1e-4 in the logit drop)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import mi_core as mi
from mi_core.interp import KnockoutSpec, run_knockout

EXAMPLES = Path(__file__).parents[2] / "examples"
pytestmark = pytest.mark.slow


def test_sweep_knockout_resumes_after_an_interruption(smollm2, tmp_path):
    spec = importlib.util.spec_from_file_location("example_sweep_knockout",
                                                  EXAMPLES / "sweep_knockout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.main(smollm2, prompts=2, out=str(tmp_path), interrupt_after=2)
    n = smollm2.num_layers
    assert r["conditions"] == 2 * n
    assert r["first_run"] == 20  # two batches of 10 recorded before the interruption
    assert r["resumed_batches"] == (2 * n - 20 + 9) // 10  # only the missing ones ran
    assert (tmp_path / "aggregate.png").read_bytes()[:4] == b"\x89PNG"
    results = r["run"].results()
    assert len(results) == 2 * n and not r["run"].failed()
    for job, res in results[:: n // 3]:  # a few conditions, both prompts
        ids = smollm2.to_tokens(job["prompt"])
        toks = smollm2.to_str_tokens(ids[0])
        subject = next(i for i, t in enumerate(toks) if job["subject"] in t)
        ref = run_knockout(smollm2, ids, KnockoutSpec(layers=[job["layer"]], from_positions=[-1],
                                                      to_positions=[subject]))
        answer = smollm2.tokenizer.encode(job["answer"], add_special_tokens=False)[0]
        assert abs(res["logit_diff"] - ref.logit_diff(answer)) < 1e-4
    # measured on 2026-11-23: the largest mean drop is at layer 23 (-3.5 over 6 prompts;
    # knocked out - baseline)
    assert r["peak_layer"] == 23 and r["mean"][23] < -1.0
    assert isinstance(mi.load_sweep(tmp_path / "store"), mi.SweepRun)
