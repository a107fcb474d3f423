"""Loading and encode/decode of CLTs against circuit-tracer's own outputs.

The fixtures were produced by scripts/make_clt_fixtures.py in a separate venv with the
`circuit-tracer` package (0.5.0): the CLT files are written by its own savers (or per its
loader for Gemma Scope 2) and the *_ref.safetensors hold its encode/decode outputs.
Tolerance: 1e-5 absolute (F32).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import mi_core as mi
from mi_core.dictionaries import CltFeatureId
from mi_clt import CrossLayerTranscoder

FIX = Path(__file__).parent / "fixtures"
TOL = 1e-5


@pytest.mark.parametrize("name", ["clt_jumprelu", "clt_relu", "tset", "gs2_clt"])
def test_encode_and_decode_match_circuit_tracer(name: str) -> None:
    clt = mi.load_dictionary(FIX / name)
    assert isinstance(clt, CrossLayerTranscoder)
    ref = load_file(str(FIX / f"{name}_ref.safetensors"))
    acts = clt.encode(ref["x"])
    assert acts.shape == ref["acts"].shape
    assert (acts - ref["acts"]).abs().max().item() < TOL
    assert int((acts != 0).sum()) > 0 and int((acts == 0).sum()) > 0  # non-trivial sparsity
    recon = clt.decode(ref["acts"])
    assert (recon - ref["recon"]).abs().max().item() < TOL


def test_layout_kinds_and_hooks_are_read_from_config() -> None:
    clt = mi.load_dictionary(FIX / "clt_jumprelu")
    assert (clt.n_layers, clt.d_model, clt.d_features) == (3, 16, 32)
    assert clt.activation == "jump_relu" and clt.cross_layer
    assert str(clt.input_hook(1)) == "blocks.1.hook_resid_mid"
    assert str(clt.output_hook(2)) == "blocks.2.hook_mlp_out"
    tset = mi.load_dictionary(FIX / "tset")  # older list-of-dicts config form
    assert not tset.cross_layer and tset.files.kind == "transcoder_set"
    # circuit-tracer's TransformerLens names map onto ours
    assert str(tset.input_hook(0)) == "blocks.0.mlp.hook_in"  # circuit-tracer mlp.hook_in
    assert str(tset.output_hook(0)) == "blocks.0.hook_mlp_out"
    gs2 = mi.load_dictionary(FIX / "gs2_clt")
    assert gs2.files.kind == "gemma_scope_2_clt" and gs2.cross_layer


def test_decoder_vectors_cover_every_downstream_layer() -> None:
    clt = mi.load_dictionary(FIX / "clt_relu")
    raw = load_file(str(FIX / "clt_relu" / "W_dec_1.safetensors"))["W_dec_1"]
    v = clt.decoder_vectors(CltFeatureId(1, 7))
    assert v.shape == (2, 16)  # layer 1 writes to layers 1 and 2
    assert torch.equal(v, raw[7])
    assert torch.equal(clt.decoder_vector(CltFeatureId(1, 7), 2), raw[7, 1])
    with pytest.raises(mi.DictionaryError, match="does not write to layer 0"):
        clt.decoder_vector(CltFeatureId(1, 7), 0)
    with pytest.raises(mi.DictionaryError, match="out of range"):
        clt.decoder_vectors(CltFeatureId(0, 32))


def test_decode_is_sum_over_source_layers_up_to_target() -> None:
    clt = mi.load_dictionary(FIX / "clt_relu")
    acts = torch.zeros(3, 1, 32)
    acts[0, 0, 3] = 2.0
    acts[2, 0, 5] = -1.5
    out = clt.decode(acts)
    d0, d2 = clt.decoder_vectors(CltFeatureId(0, 3)), clt.decoder_vectors(CltFeatureId(2, 5))
    want = clt.b_dec.clone().unsqueeze(1)
    want[0, 0] += 2.0 * d0[0]
    want[1, 0] += 2.0 * d0[1]
    want[2, 0] += 2.0 * d0[2] - 1.5 * d2[0]
    assert (out - want).abs().max().item() < TOL


def test_top_k_returns_strongest_features_per_position() -> None:
    clt = mi.load_dictionary(FIX / "clt_jumprelu")
    acts = torch.zeros(3, 2, 32)
    acts[1, 0, 4], acts[2, 0, 9], acts[0, 0, 1] = 3.0, 5.0, 1.0
    acts[0, 1, 0] = 0.5
    top = clt.top_k(acts, 2)
    assert top[0] == [(CltFeatureId(2, 9), 5.0), (CltFeatureId(1, 4), 3.0)]
    assert top[1] == [(CltFeatureId(0, 0), 0.5)]


def test_topk_activation_keeps_k_largest(tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "topk"
    shutil.copytree(FIX / "clt_relu", d)
    (d / "config.yaml").write_text("model_kind: cross_layer_transcoder\nactivation: topk\nk: 3\n")
    clt = mi.load_dictionary(d)
    x = torch.randn(3, 4, 16)
    acts = clt.encode(x)
    assert ((acts != 0).sum(-1) == 3).all()
    pre = clt.pre_activations(x[1], 1)
    assert torch.equal(acts[1].topk(3).values.sort().values, pre.topk(3).values.sort().values)


def test_bf16_load_casts_on_read() -> None:
    clt = mi.load_dictionary(FIX / "clt_relu", dtype=torch.bfloat16)
    ref = load_file(str(FIX / "clt_relu_ref.safetensors"))
    assert clt.encode(ref["x"]).dtype == torch.bfloat16
    assert clt.decoder_vectors(CltFeatureId(0, 0)).dtype == torch.bfloat16
