"""get_weight (TransformerLens names/layouts), final_norm / unembed / project_to_vocab: each
checked by recomputing a captured activation from the weights."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.errors import WeightLoadError

SEQ = 8
TOL = 1e-5


def test_qkv_weights_recompute_hook_q_k_v_with_biases(tiny, make_ids):
    model = tiny("qwen2_untied").load()  # has q/k/v biases
    be = model.backend
    names = ["blocks.1.attn.hook_in", "blocks.1.attn.hook_q", "blocks.1.attn.hook_k",
             "blocks.1.attn.hook_v"]
    c = model.forward(make_ids(2, SEQ), mi.HookSpec().capture_all(names))
    x = c[names[0]]
    for n, w, b in ((names[1], "W_Q", "b_Q"), (names[2], "W_K", "b_K"), (names[3], "W_V", "b_V")):
        got = torch.einsum("bsd,hdk->bshk", x, be.get_weight(w, 1)) + be.get_weight(b, 1)
        assert (got - c[n]).abs().max().item() < TOL, w


def test_w_o_recomputes_per_head_results(llama_model, make_ids):
    be = llama_model.backend
    names = ["blocks.0.attn.hook_z", "blocks.0.attn.hook_result"]
    c = llama_model.forward(make_ids(2, SEQ), mi.HookSpec().capture_all(names))
    got = torch.einsum("bshk,hkd->bshd", c[names[0]], be.get_weight("W_O", 0))
    assert (got - c[names[1]]).abs().max().item() < TOL


def test_embedding_unembedding_and_final_norm(tiny, make_ids):
    model = tiny("gemma2").load()  # embedding scale and final soft-capping
    be = model.backend
    ids = make_ids(2, SEQ)
    last = f"blocks.{model.num_layers - 1}.hook_resid_post"
    names = ["hook_embed", last, "ln_final.hook_scale", "ln_final.hook_normalized"]
    c = model.forward(ids, mi.HookSpec().capture_all(names))
    assert (be.get_weight("W_E")[ids] * 64 ** 0.5 - c["hook_embed"]).abs().max().item() < TOL
    assert (be.project_to_vocab(c[last]) - c.output).abs().max().item() < TOL
    assert (model.project_to_vocab(c[last]) - c.output).abs().max().item() < TOL
    # hook_final_norm is x / scale before the gain, as TransformerLens (RMSNorm: no centring)
    assert (c[last] / c["ln_final.hook_scale"] - c["hook_final_norm"]).abs().max().item() < TOL
    lin = be.final_norm(c[last] * 3, scale=3 * c["ln_final.hook_scale"])
    assert (lin - be.final_norm(c[last])).abs().max().item() < TOL
    raw = be.final_norm(c[last]) @ be.get_weight("W_U")
    assert (torch.tanh(raw / 5.0) * 5.0 - c.output).abs().max().item() < TOL  # cap 5 (conftest)


def test_weight_shapes_and_attributes(tiny):
    model = tiny("phi3").load()  # fused qkv / gate_up are split into views
    be = model.backend
    d, h, kv, hd, m = be.hidden_size, be.num_heads, be.num_kv_heads, be.d_head, be.d_mlp
    shapes = {"W_E": (be.vocab_size, d), "W_U": (d, be.vocab_size)}
    for n, s in shapes.items():
        assert tuple(be.get_weight(n).shape) == s
    layer = {"W_Q": (h, d, hd), "W_K": (kv, d, hd), "W_V": (kv, d, hd), "W_O": (h, hd, d),
             "W_in": (d, m), "W_gate": (d, m), "W_up": (d, m), "W_out": (m, d), "ln1.w": (d,)}
    for n, s in layer.items():
        assert tuple(be.get_weight(n, 0).shape) == s, n
    assert be.max_positions == 64


def test_fused_checkpoint_weights_are_views_not_copies(tiny):
    be = tiny("phi3").load().backend
    a = be.w.layers[0].attn
    assert a.w_q.untyped_storage().data_ptr() == a.w_k.untyped_storage().data_ptr()


def test_absent_or_unknown_weight_is_an_error(llama_model):
    be = llama_model.backend
    with pytest.raises(WeightLoadError, match="b_Q"):
        be.get_weight("b_Q", 0)  # LLaMA has no q bias
    with pytest.raises(WeightLoadError, match="W_nope"):
        be.get_weight("W_nope", 0)
    with pytest.raises(WeightLoadError, match="layer"):
        be.get_weight("W_Q", 7)
