"""Every tensor an analysis creates is made on the model's device.

The audit runs each analysis on a CPU model under ``torch.device("meta")``: a factory call
(``zeros``, ``arange``, ``tensor``, ``ones``, ...) that names no device then makes a meta
tensor, and mixing it with the model's CPU tensors raises. On CUDA the same call would put a
mask, position ids or an accumulator on the CPU: an error there too, or a silent transfer
every step. The numbers must also be the ones computed outside the audit. Inputs are made
before the audit starts (what a caller passes is the caller's business).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import mi_core as mi
from mi_core.interp import KnockoutSpec, SteeringSpec
from mi_core.interp.knockout import run_knockout
from mi_core.interp.patching import attribution_patching, logit_diff_metric

FIX = Path(__file__).parent.parent / "clt" / "fixtures"


@pytest.fixture(scope="module")
def model() -> mi.MIModel:
    return mi.MIModel.from_pretrained(FIX / "tiny_llama")


def _analyses(model: mi.MIModel) -> dict[str, Callable[[], Any]]:
    from mi_clt.attribution import attribute

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.vocab_size, (2, 7), generator=g)
    pad = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    one = ids[:1]
    clt = mi.load_dictionary(FIX / "attr_clt")
    meta = json.loads((FIX / "attr_ref.json").read_text())
    direction = torch.randn(model.hidden_size, generator=g)
    every = mi.HookSpec().capture_all(model.hook_points())
    every.intervene(mi.HookPoint.resid_post(0), mi.Add(direction))
    return {
        "forward, every point, an intervention": lambda: model.forward(ids, every).output,
        "padded forward": lambda: model.forward(ids, attention_mask=pad).output,
        "cached generation, padded": lambda: model.generate(
            ids, max_new_tokens=3, attention_mask=pad, stop_at_eos=False).tokens,
        "logit lens": lambda: mi.LogitLensAnalysis(k=3).run(model, one),
        "knockout": lambda: run_knockout(model, one, KnockoutSpec(
            layers=[0], heads=[0], from_positions=[5], to_positions=[1])).ablated_logits,
        "steering": lambda: mi.apply_steering(model, one, SteeringSpec.residual(
            [0], direction, strength=2.0)).steered_logits,
        "attribution patching": lambda: attribution_patching(
            model, one, ids[1:], logit_diff_metric(3, 4)).grid,
        "CLT attribution graph": lambda: attribute(
            model, clt, one[0].tolist(), max_n_logits=meta["max_n_logits"],
            desired_logit_prob=meta["desired_logit_prob"], batch_size=16).adjacency,
    }


@pytest.mark.parametrize("name", ["forward, every point, an intervention", "padded forward",
                                  "cached generation, padded", "logit lens", "knockout",
                                  "steering", "attribution patching", "CLT attribution graph"])
def test_analysis_creates_its_tensors_on_the_models_device(model, name):
    fn = _analyses(model)[name]
    expected = fn()
    with torch.device("meta"):
        got = fn()
    if isinstance(expected, torch.Tensor):
        assert got.device.type != "meta"  # on the model's device, or a result on the CPU
        assert torch.equal(got, expected)
    else:
        assert got == expected
