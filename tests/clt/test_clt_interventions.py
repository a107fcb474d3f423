"""Injection / suppression / position sweep on the tiny LLaMA fixture.

Independent check: an Add at ``hook_mlp_out`` of layer t is the same residual stream as an
Add at ``hook_resid_post`` of layer t, so the HookSpec from prepare_hook_injection must give
the logits of a hand-built spec adding the decoder rows read straight from the
W_dec_{i}.safetensors files at resid_post (F32, 1e-5).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import mi_core as mi
from mi_core.dictionaries import CltFeatureId
from mi_clt.interventions import (Injection, position_sweep, prepare_hook_injection,
                                  suppress_and_inject, suppression_injections)

FIX = Path(__file__).parent / "fixtures"
IDS = torch.tensor([[0, 5, 17, 9, 33, 21, 40, 12]])


@pytest.fixture(scope="module")
def model_clt():
    return mi.MIModel.from_pretrained(FIX / "tiny_llama"), mi.load_dictionary(FIX / "attr_clt")


def test_injection_equals_adding_raw_decoder_rows_at_resid_post(model_clt) -> None:
    model, clt = model_clt
    f = CltFeatureId(0, 11)
    spec = prepare_hook_injection(clt, [Injection(f, 3, 2.5), (CltFeatureId(1, 4), 6, -1.0)], 8)
    assert spec.num_interventions() == 3 and spec.has_intervention_at("blocks.2.hook_mlp_out")
    w0 = load_file(str(FIX / "attr_clt" / "W_dec_0.safetensors"))["W_dec_0"]
    w1 = load_file(str(FIX / "attr_clt" / "W_dec_1.safetensors"))["W_dec_1"]
    manual = mi.HookSpec()
    for t in range(3):
        d = torch.zeros(1, 8, 16)
        d[0, 3] += 2.5 * w0[11, t]
        if t >= 1:
            d[0, 6] += -1.0 * w1[4, t - 1]
        manual.intervene(f"blocks.{t}.hook_resid_post", mi.Add(d))
    with torch.no_grad():
        a = model.forward(IDS, spec).output
        b = model.forward(IDS, manual).output
        clean = model.forward(IDS, mi.HookSpec()).output
    assert (a - b).abs().max() < 1e-5
    assert (a - clean).abs().max() > 1e-2  # the injection does something
    assert torch.equal(a[0, :3], clean[0, :3])  # causal: nothing before position 3 changes


def test_suppression_removes_the_feature_contribution(model_clt) -> None:
    model, clt = model_clt
    acts, _ = clt.encode_model(model, IDS)
    layer, pos, idx = (int(v) for v in acts[:, 1:].nonzero()[0])
    pos += 1
    f = CltFeatureId(layer, idx)
    injs = suppression_injections(model, clt, IDS, [f], positions=[pos])
    assert injs == [Injection(f, pos, -float(acts[layer, pos, idx]))]
    spec = prepare_hook_injection(clt, injs, 8).capture(clt.output_hook(layer))
    with torch.no_grad():
        out = model.forward(IDS, spec)[clt.output_hook(layer)][0, pos]
        clean = model.forward(IDS, mi.HookSpec().capture(clt.output_hook(layer)))
    want = clean[clt.output_hook(layer)][0, pos] - acts[layer, pos, idx] * clt.decoder_vectors(f)[0]
    assert (out - want).abs().max() < 1e-5


def test_position_sweep_matches_one_forward_per_position(model_clt) -> None:
    model, clt = model_clt
    sup = [CltFeatureId(0, 3)]
    inj = [(CltFeatureId(0, 11), 4.0)]
    res = position_sweep(model, clt, IDS, target_token=7, inject=inj, suppress=sup, chunk=3)
    assert res.positions == list(range(8)) and len(res.probabilities) == 8
    for p in (0, 4, 7):
        spec = suppress_and_inject(model, clt, IDS, sup, inj, position=p)
        with torch.no_grad():
            prob = torch.softmax(model.forward(IDS, spec).output[0, -1], -1)[7]
        assert abs(float(prob) - res.probabilities[p]) < 1e-6
    assert res.best_position in res.positions
    assert len(set(round(x, 6) for x in res.probabilities)) > 1


def test_injection_position_out_of_range_is_an_error(model_clt) -> None:
    _, clt = model_clt
    with pytest.raises(mi.InterventionError, match="out of range"):
        prepare_hook_injection(clt, [Injection(CltFeatureId(0, 1), 9, 1.0)], 8)


def test_steering_vectors_are_cached_per_feature(model_clt) -> None:
    _, clt = model_clt
    vecs = clt.cache_steering_vectors_all_downstream([CltFeatureId(1, 2), CltFeatureId(2, 0)])
    assert vecs[CltFeatureId(1, 2)].shape == (2, 16) and vecs[CltFeatureId(2, 0)].shape == (1, 16)
    assert clt.cache_steering_vectors_all_downstream([CltFeatureId(1, 2)])[CltFeatureId(1, 2)] \
        is vecs[CltFeatureId(1, 2)]
