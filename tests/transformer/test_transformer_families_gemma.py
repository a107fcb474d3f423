"""Gemma-4 (dense and MoE) and Gemma-3n against transformers.

Reference: the tiny random checkpoints of tests/support/tiny_families_gemma.py loaded by
transformers (eager attention, F32; shared keys and values, a head size per layer type, keys
as values, per-layer inputs, the MoE beside the MLP, AltUp with an active stream that is not
the first, Laurel, activation sparsity). Tolerance: max abs diff < 1e-4 on logits, every
layer's residual stream (Gemma-3n: every AltUp stream, transformers' hidden states being the
stacks), attention patterns, and each new internal against the transformers module computing
it; routing indices and greedy tokens exactly equal. (Measured: 0.0, bit for bit, on every
checkpoint here.)
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

import mi_core as mi
from tests.support.family_checks import assert_left_padding_rows_alone, assert_matches_transformers
from tests.support.hf_reference import assert_matches_hf_with_hook
from tests.support.tiny_families_gemma import GEMMA_FAMILIES, cached_gemma

TOL = 1e-4
NAMES = list(GEMMA_FAMILIES)
GEMMA4 = ["gemma4_text", "gemma4_moe"]
GEMMA3N = ["gemma3n_text", "gemma3n_active1"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return cached_gemma(tmp_path_factory)


@pytest.fixture(scope="module")
def ours(gemma):
    models: dict[str, mi.MIModel] = {}

    def get(name: str) -> mi.MIModel:
        if name not in models:
            models[name] = gemma(name).load()
        return models[name]

    return get


# -- parity ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", GEMMA4)
def test_gemma4_matches_transformers(gemma, make_ids, name):
    assert_matches_transformers(gemma(name), make_ids(2, 16, seed=41))


@pytest.mark.parametrize("name", GEMMA3N)
def test_gemma3n_matches_transformers_on_every_altup_stream(gemma, ours, make_ids, name):
    """transformers' hidden states of Gemma-3n are the stacks [n, batch, seq, d_model]: the
    embedding's and each layer's. Ours: ``altup.hook_streams_pre`` of layer 0 and
    ``altup.hook_streams_post`` of each layer ([batch, seq, n, d_model]); ``hook_resid_post``
    is the active stream of the latter, ``hook_resid_pre`` of the next layer the same."""
    t, model = gemma(name), ours(name)
    a = model.config.altup.active
    ids = make_ids(2, 16, seed=41)
    with torch.no_grad():
        ref = t.hf(ids, output_hidden_states=True, output_attentions=True)
    L = model.num_layers
    pts = ["blocks.0.altup.hook_streams_pre", "hook_embed"]
    for i in range(L):
        pts += [f"blocks.{i}.altup.hook_streams_post", f"blocks.{i}.hook_resid_post",
                f"blocks.{i}.hook_resid_pre", f"blocks.{i}.attn.hook_pattern"]
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    assert (cache.output - ref.logits).abs().max().item() < TOL
    assert cache.output.std().item() > 0.1
    stack = lambda h: h.permute(1, 2, 0, 3)  # noqa: E731  [n, b, s, d] -> [b, s, n, d]
    assert (cache[pts[0]] - stack(ref.hidden_states[0])).abs().max().item() < TOL
    assert torch.equal(cache["hook_embed"], cache[pts[0]][:, :, 0])  # stream 0: the embedding
    for i in range(L):
        post = cache[f"blocks.{i}.altup.hook_streams_post"]
        assert (post - stack(ref.hidden_states[i + 1])).abs().max().item() < TOL, i
        assert torch.equal(cache[f"blocks.{i}.hook_resid_post"], post[:, :, a])
        if i + 1 < L:
            assert torch.equal(cache[f"blocks.{i + 1}.hook_resid_pre"], post[:, :, a])
        pat = cache[f"blocks.{i}.attn.hook_pattern"]
        assert (pat - ref.attentions[i]).abs().max().item() < TOL, i


@pytest.mark.parametrize("name", NAMES)
def test_left_padding_rows_equal_running_alone(ours, make_ids, name):
    assert_left_padding_rows_alone(ours(name), [make_ids(1, 14, seed=5)[0],
                                                make_ids(1, 8, seed=6)[0]])


@pytest.mark.parametrize("name", NAMES)
def test_greedy_generation_equals_transformers(gemma, ours, make_ids, name):
    """8 prompt + 10 new tokens with the KV cache (past the window; the shared layers read
    their source layers' cached keys)."""
    t, model = gemma(name), ours(name)
    ids = make_ids(2, 8, seed=7)
    got = model.generate(ids, max_new_tokens=10, stop_at_eos=False)
    with torch.no_grad():
        ref = copy.deepcopy(t.hf).generate(ids, attention_mask=torch.ones_like(ids),
                                           max_new_tokens=10, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(got.tokens, ref)


def test_explicit_and_sdpa_paths_agree(ours, make_ids):
    for name in ("gemma4_text", "gemma3n_text"):
        model, ids = ours(name), make_ids(2, 12, seed=4)
        torch.testing.assert_close(model.forward(ids, attn_impl="sdpa").output,
                                   model.forward(ids, attn_impl="explicit").output,
                                   atol=1e-5, rtol=0)


# -- the axes as parsed ------------------------------------------------------------------------

def test_layers_say_their_geometry_and_which_keys_they_share(ours):
    c = ours("gemma4_text").config
    assert ours("gemma4_text").layer_types == ["sliding_attention", "full_attention"] * 2
    assert c.layer_head_dim == (16, 32, 16, 32) and c.layer_kv_heads == ()
    assert c.layer_kv_source == (0, 1, 0, 1)  # layers 2, 3 read layers 0, 1's keys
    assert c.layer_mlp_size == (96, 96, 192, 192)  # double-wide on the shared layers
    m = ours("gemma4_moe").config
    assert m.layer_k_eq_v == (False, True, True) and m.layer_kv_heads == (2, 1, 1)
    assert m.layer_head_dim == (16, 24, 24) and m.moe.beside_mlp
    n = ours("gemma3n_text").config
    assert n.layer_sparsity == (0.95, 0.5, 0.0, 0.0) and n.altup.num_inputs == 3
    # coefficients past altup_coef_clip (0.05): transformers clips them only while training,
    # so parity (above) shows they are used unclipped at inference, as here
    coefs = ours("gemma3n_text").backend.w.layers[0].altup.prediction_coefs
    assert n.altup.coef_clip == 0.05 and coefs.abs().max().item() > 0.05
    assert n.layer_mlp_size == (96, 96, 128, 128) and n.laurel_rank == 4


def test_shared_layers_have_no_key_points_and_no_key_weights(ours):
    model = ours("gemma4_text")
    names = {p.name for p in model.hook_points()}
    for p in ("attn.hook_k", "attn.hook_v", "attn.hook_rot_k", "attn.k_ln.hook_scale",
              "hook_k_input", "hook_attn_in"):
        assert f"blocks.0.{p}" in names
        assert f"blocks.2.{p}" not in names
    assert "blocks.2.attn.hook_q" in names and "blocks.2.attn.hook_pattern" in names
    with pytest.raises(mi.WeightLoadError, match="keys and values of layer 0"):
        model.backend.get_weight("W_K", 2)
    assert model.backend.get_weight("W_Q", 3).shape == (4, 64, 32)
    assert model.backend.get_weight("W_O", 1).shape == (4, 32, 64)
    moe = ours("gemma4_moe")  # keys as values: W_V is the key projection
    assert torch.equal(moe.backend.get_weight("W_V", 1), moe.backend.get_weight("W_K", 1))
    assert f"blocks.1.hook_v_input" not in {p.name for p in moe.hook_points()}


def test_a_key_intervention_at_the_source_reaches_the_sharing_layers(gemma, ours, make_ids):
    """Steering layer 0's keys changes layer 2's attention too (it reads them), as the same
    change made in transformers' layer 0 k_norm does."""
    model, hf = ours("gemma4_text"), gemma("gemma4_text").hf
    ids = make_ids(1, 10, seed=3)
    delta = 0.5 * torch.randn(16, generator=torch.Generator().manual_seed(0))
    cache = model.forward(ids, mi.HookSpec().intervene("blocks.0.attn.hook_k", mi.Add(delta))
                          .capture("blocks.2.attn.hook_pattern"))
    clean = model.forward(ids, mi.HookSpec().capture("blocks.2.attn.hook_pattern"))
    assert (cache["blocks.2.attn.hook_pattern"] - clean["blocks.2.attn.hook_pattern"]
            ).abs().max().item() > 1e-3
    assert_matches_hf_with_hook(cache.output, hf, ids,
                                hf.model.layers[0].self_attn.k_norm, lambda m, i, o: o + delta)


def test_every_point_has_the_shape_hook_shape_says(ours, make_ids):
    for name in NAMES:
        model = ours(name)
        pts = [p.name for p in model.hook_points()]
        cache = model.forward(make_ids(2, 6, seed=1), mi.HookSpec().capture_all(pts))
        for p in pts:
            want = model.backend.hook_shape(p, 2, 6)
            got = tuple(cache[p].shape)
            assert len(want) == len(got) and all(w in (-1, g) for w, g in zip(want, got)), \
                (name, p, want, got)


# -- per-layer inputs ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gemma4_text", "gemma3n_text"])
def test_per_layer_input_points_equal_transformers(gemma, ours, make_ids, name):
    """hook_per_layer_input is transformers' per_layer_inputs[:, :, i] (Gemma-3n: ids past
    the 100-row table read row 0, as transformers); an Add there equals transformers with the
    same change to the decoder layer's per_layer_input."""
    t, model = gemma(name), ours(name)
    ids = make_ids(2, 12, seed=9)
    if name == "gemma3n_text":
        assert (ids >= 100).any()  # some ids are outside the per-layer table
    inner = t.hf.model
    with torch.no_grad():
        emb = inner.embed_tokens(ids)
        ref = inner.project_per_layer_inputs(emb, inner.get_per_layer_inputs(ids))
    pts = [f"blocks.{i}.hook_per_layer_input" for i in range(model.num_layers)]
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    for i, p in enumerate(pts):
        assert (cache[p] - ref[:, :, i]).abs().max().item() < TOL
    delta = torch.randn(8, generator=torch.Generator().manual_seed(1))
    got = model.forward(ids, mi.HookSpec().intervene(pts[1], mi.Add(delta))).output
    layer = inner.layers[1]

    def pre(module, args, kwargs):  # per_layer_input: a positional or keyword argument
        if "per_layer_input" in kwargs and kwargs["per_layer_input"] is not None:
            kwargs["per_layer_input"] = kwargs["per_layer_input"] + delta
        else:
            args = list(args)
            idx = 1 if name.startswith("gemma4") else 2
            args[idx] = args[idx] + delta
            args = tuple(args)
        return args, kwargs

    handle = layer.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with torch.no_grad():
            want = t.hf(ids).logits
    finally:
        handle.remove()
    assert (got - want).abs().max().item() < TOL
    assert (got - model.forward(ids).output).abs().max().item() > 1e-3


def test_gemma4_ids_past_the_per_layer_table_are_refused(gemma, tmp_path, make_ids):
    """transformers' Gemma-4 would index past embed_tokens_per_layer: a TokenizerError names
    the ids (Gemma-3n reads row 0 for them, as its transformers code does)."""
    from safetensors.torch import load_file, save_file

    t = gemma("gemma4_text")
    shutil.copytree(t.path, tmp_path / "ck")
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    cfg["vocab_size_per_layer_input"] = 100
    (tmp_path / "ck" / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(tmp_path / "ck" / "model.safetensors"))
    tensors["model.embed_tokens_per_layer.weight"] = \
        tensors["model.embed_tokens_per_layer.weight"][:100].clone()
    save_file(tensors, str(tmp_path / "ck" / "model.safetensors"))
    model = mi.MIModel.from_pretrained(tmp_path / "ck")
    model.forward(torch.tensor([[3, 50, 99]]))
    with pytest.raises(mi.TokenizerError, match="per-layer embedding table"):
        model.forward(torch.tensor([[3, 100, 99]]))


# -- keys and values as published ---------------------------------------------------------------

def test_published_shared_layers_key_tensors_are_ignored(gemma, tmp_path, make_ids):
    """Published Gemma-3n / Gemma-4 checkpoints keep k / v projections and norms for the
    layers that share keys (transformers ignores them): they load, unused."""
    from safetensors.torch import load_file, save_file

    t = gemma("gemma3n_text")
    shutil.copytree(t.path, tmp_path / "ck")
    tensors = load_file(str(tmp_path / "ck" / "model.safetensors"))
    for i in (2, 3):
        p = f"model.layers.{i}.self_attn."
        tensors[p + "k_proj.weight"] = torch.randn(32, 64)
        tensors[p + "v_proj.weight"] = torch.randn(32, 64)
        tensors[p + "k_norm.weight"] = torch.randn(16)
    save_file(tensors, str(tmp_path / "ck" / "model.safetensors"))
    ids = make_ids(1, 9, seed=2)
    torch.testing.assert_close(mi.MIModel.from_pretrained(tmp_path / "ck").forward(ids).output,
                               t.load().forward(ids).output, atol=0, rtol=0)


# -- AltUp and Laurel ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", GEMMA3N)
def test_altup_and_laurel_points_equal_transformers(gemma, ours, make_ids, name):
    """altup.hook_predictions / hook_corrected are transformers' AltUp predict / correct
    outputs ([batch, seq, n, d_model]), altup.hook_activated what correct reads, laurel.hook_out
    the Laurel block's output."""
    t, model = gemma(name), ours(name)
    ids = make_ids(2, 10, seed=13)
    seen: dict[str, torch.Tensor] = {}
    layer = t.hf.model.layers[1]
    predict, correct = layer.altup.predict, layer.altup.correct

    def rec_predict(h):
        out = predict(h)
        seen["pred"] = out.detach().clone()
        return out

    def rec_correct(p, a):  # (a copy: transformers then adds the branch in place)
        out = correct(p, a)
        seen["act"], seen["corr"] = a.detach().clone(), out.detach().clone()
        return out

    layer.altup.predict, layer.altup.correct = rec_predict, rec_correct
    handle = layer.laurel.register_forward_hook(
        lambda m, i, o: seen.__setitem__("laurel", o.detach()))
    try:
        with torch.no_grad():
            t.hf(ids)
    finally:
        del layer.altup.predict, layer.altup.correct
        handle.remove()
    p = "blocks.1."
    pts = [p + "altup.hook_predictions", p + "altup.hook_corrected", p + "altup.hook_activated",
           p + "laurel.hook_out"]
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    stack = lambda h: h.permute(1, 2, 0, 3)  # noqa: E731
    assert (cache[pts[0]] - stack(seen["pred"])).abs().max().item() < TOL
    assert (cache[pts[1]] - stack(seen["corr"])).abs().max().item() < TOL
    assert (cache[pts[2]] - seen["act"]).abs().max().item() < TOL
    assert (cache[pts[3]] - seen["laurel"]).abs().max().item() < TOL


def test_resid_post_intervention_edits_the_active_stream_as_transformers(gemma, ours, make_ids):
    """An Add at hook_resid_post of an AltUp model changes the active stream of the layer's
    output stack: the same as transformers with the change made to stream a of the decoder
    layer's output."""
    model, t = ours("gemma3n_active1"), gemma("gemma3n_active1")
    a = model.config.altup.active
    ids = make_ids(1, 9, seed=14)
    delta = torch.randn(64, generator=torch.Generator().manual_seed(2))
    got = model.forward(ids, mi.HookSpec().intervene("blocks.0.hook_resid_post",
                                                     mi.Add(delta))).output

    def hook(m, i, o):
        o = o.clone()
        o[a] = o[a] + delta
        return o

    assert_matches_hf_with_hook(got, t.hf, ids, t.hf.model.layers[0], hook)


def test_sparse_layers_cut_most_gate_activations(ours, make_ids):
    """Layer 0 keeps about 5% of its gate pre-activations (sparsity 0.95), layer 2 all."""
    model = ours("gemma3n_text")
    cache = model.forward(make_ids(2, 12, seed=3), mi.HookSpec().capture_all(
        ["blocks.0.mlp.hook_post", "blocks.2.mlp.hook_post"]))
    zero = lambda t: (t == 0).float().mean().item()  # noqa: E731
    assert zero(cache["blocks.0.mlp.hook_post"]) > 0.85
    assert zero(cache["blocks.2.mlp.hook_post"]) < 0.05


# -- the MoE beside the MLP --------------------------------------------------------------------

def test_gemma4_router_and_branch_points_equal_transformers(gemma, ours, make_ids):
    """hook_router_logits is transformers' router projection, the chosen experts its top-k
    (as sets) with its weights (renormalised, times per_expert_scale); mlp.hook_dense_out /
    hook_moe_out the two post-normed branches."""
    t, model = gemma("gemma4_moe"), ours("gemma4_moe")
    ids = make_ids(2, 12, seed=22)
    seen: dict[str, torch.Tensor] = {}
    layer = t.hf.model.layers[1]
    hs = [layer.router.proj.register_forward_hook(
              lambda m, i, o: seen.__setitem__("logits", o.detach())),
          layer.router.register_forward_hook(
              lambda m, i, o: seen.update(w=o[1].detach(), idx=o[2].detach())),
          layer.post_feedforward_layernorm_1.register_forward_hook(
              lambda m, i, o: seen.__setitem__("dense", o.detach())),
          layer.post_feedforward_layernorm_2.register_forward_hook(
              lambda m, i, o: seen.__setitem__("moe", o.detach()))]
    try:
        with torch.no_grad():
            t.hf(ids)
    finally:
        for h in hs:
            h.remove()
    p = "blocks.1.mlp."
    pts = [p + k for k in ("hook_router_logits", "hook_expert_weights", "hook_expert_indices",
                           "hook_dense_out", "hook_moe_out")]
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    assert (cache[pts[0]].reshape(-1, 4) - seen["logits"]).abs().max().item() < TOL
    idx = cache[pts[2]].reshape(-1, 2)
    order, ref_order = idx.argsort(-1), seen["idx"].argsort(-1)
    assert torch.equal(idx.gather(-1, order), seen["idx"].gather(-1, ref_order))
    w = cache[pts[1]].reshape(-1, 2)
    assert (w.gather(-1, order) - seen["w"].gather(-1, ref_order)).abs().max().item() < TOL
    assert (cache[pts[3]] - seen["dense"]).abs().max().item() < TOL
    assert (cache[pts[4]] - seen["moe"]).abs().max().item() < TOL


@pytest.mark.parametrize("name", ["gemma4_text", "gemma4_moe", "gemma3n_text"])
def test_bfloat16_error_is_no_worse_than_transformers_in_bfloat16(gemma, make_ids, name):
    """As tests/transformer/test_transformer_half_precision.py: our bf16 logits' error vs the
    F32 reference within 1.25x of transformers' own bf16 forward (mean) and 2x (max), loaded
    as its users load it (``from_pretrained(dtype=bfloat16)``: Gemma-4's equal ours bit for
    bit; the F32 model cast with ``.to`` breaks one routing near-tie of gemma4_moe
    differently, 1.6x on these 24 tokens). Measured: mean 1.00x / 1.00x / 1.00x."""
    from transformers import AutoModelForCausalLM

    from mi_core.registry import ModelSource
    from mi_transformer.loader import load_backend

    t = gemma(name)
    be = load_backend(ModelSource(path=t.path), torch.device("cpu"), torch.bfloat16)
    ids = make_ids(2, 12, seed=5)
    got = mi.MIModel(be).forward(ids).output
    with torch.no_grad():
        ref32 = t.hf(ids).logits
        ref16 = AutoModelForCausalLM.from_pretrained(t.path, dtype=torch.bfloat16)(ids).logits
    assert got.dtype == torch.bfloat16
    ours, theirs = (got.float() - ref32).abs(), (ref16.float() - ref32).abs()
    assert ours.mean().item() <= 1.25 * theirs.mean().item()
    assert ours.max().item() <= 2 * theirs.max().item() + 1e-3


# -- configs as published and as transformers writes them -----------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_to_dict_config_loads_with_transformers_numbers(gemma, tmp_path, make_ids, name):
    """``config.to_dict()`` (every attribute; Gemma-4: the ``per_layer_config`` it writes)
    beside the same safetensors; save_pretrained's config is the checkpoint's own."""
    t = gemma(name)
    d = tmp_path / "to_dict"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(t.hf.config.to_dict()))
    (d / "model.safetensors").symlink_to(t.path / "model.safetensors")
    ids = make_ids(1, 10, seed=51)
    with torch.no_grad():
        want = t.hf(ids).logits
    for path in (t.path, d):
        got = mi.MIModel.from_pretrained(path).forward(ids).output
        assert (got - want).abs().max().item() < TOL


def _gemma4_published(tc: dict) -> dict:
    """The checkpoint's config in the published spelling: global_head_dim /
    num_global_key_value_heads instead of per_layer_config, the keys Google's configs carry."""
    out = {k: v for k, v in tc.items() if k != "per_layer_config"}
    plc = tc.get("per_layer_config") or {}
    full = next(iter(plc.values()), {})
    out.update(global_head_dim=full.get("head_dim", 512), use_bidirectional_attention="vision")
    if "num_key_value_heads" in full:
        out["num_global_key_value_heads"] = full["num_key_value_heads"]
    return out


@pytest.mark.parametrize("name", GEMMA4)
def test_gemma4_published_spelling_parses_as_transformers_writes_it(gemma, name):
    from mi_transformer.config import parse_config

    written = gemma(name).config
    assert parse_config(_gemma4_published(written)) == parse_config(written)


def test_gemma4_disagreeing_geometry_keys_and_bidirectional_attention_are_refused(gemma):
    from mi_transformer.config import parse_config

    written = gemma("gemma4_moe").config
    with pytest.raises(mi.ConfigError, match="global_head_dim = 48 disagrees"):
        parse_config({**written, "global_head_dim": 48})
    with pytest.raises(mi.ConfigError, match="num_global_key_value_heads = 2 disagrees"):
        parse_config({**written, "num_global_key_value_heads": 2})
    with pytest.raises(mi.ConfigError, match="use_bidirectional_attention"):
        parse_config({**written, "use_bidirectional_attention": "all"})
    with pytest.raises(mi.ConfigError, match="per-layer overrides"):
        parse_config({**written, "per_layer_config": {"1": {"intermediate_size": 8}}})
    with pytest.raises(mi.ConfigError, match="proportional"):
        parse_config({**written, "rope_parameters": {**written["rope_parameters"],
                      "full_attention": {"rope_type": "proportional", "rope_theta": 1.0,
                                         "beta_fast": 3}}})


def test_gemma3n_published_keys_load(gemma):
    """The published text_config's spelling: rope_theta / rope_local_base_freq /
    rope_scaling null instead of rope_parameters, plus altup_lr_multiplier (training) and
    query_pre_attn_scalar (transformers' Gemma-3n never reads it: its attention scale is 1)."""
    from mi_transformer.config import parse_config

    written = gemma("gemma3n_text").config
    ropes = written["rope_parameters"]
    published = {k: v for k, v in written.items() if k != "rope_parameters"}
    published.update(rope_theta=ropes["full_attention"]["rope_theta"],
                     rope_local_base_freq=ropes["sliding_attention"]["rope_theta"],
                     rope_scaling=None, altup_lr_multiplier=1.0, query_pre_attn_scalar=256)
    assert parse_config(published) == parse_config(written)


def _multimodal(tmp_path, t, config: dict, extra: dict[str, torch.Tensor]):
    """A multimodal checkpoint of tiny text model `t`: its tensors under
    model.language_model., the towers' (`extra`) beside them, `config` as config.json."""
    from safetensors.torch import load_file, save_file

    tensors = {k.replace("model.", "model.language_model.", 1): v
               for k, v in load_file(str(t.path / "model.safetensors")).items()}
    tensors.update(extra)
    out = tmp_path / "mm"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("name", ["gemma4_text", "gemma3n_text"])
def test_multimodal_checkpoint_loads_its_language_model(gemma, tmp_path, make_ids, name):
    """gemma4 / gemma3n wrappers as transformers' to_dict writes them (vision and audio
    sub-configs, token ids): the language model under model.language_model. loads, the
    towers' tensors are ignored, and the text forward equals the text model's. (Gemma-3n's
    wrapper needs timm to be built; the config is its to_dict, the tensors the text model's
    renamed as the wrapper saves them.)"""
    from transformers import Gemma3nConfig, Gemma4Config, Gemma4VisionConfig

    t = gemma(name)
    text = t.hf.config.to_dict()
    if name == "gemma4_text":
        cfg = Gemma4Config(text_config=text, vision_config=Gemma4VisionConfig().to_dict())
    else:
        cfg = Gemma3nConfig(text_config=text)
    towers = {"model.vision_tower.encoder.weight": torch.zeros(2, 2),
              "model.audio_tower.conv.weight": torch.zeros(2),
              "model.embed_vision.embedding.weight": torch.zeros(2, 2)}
    path = _multimodal(tmp_path, t, cfg.to_dict(), towers)
    model = mi.MIModel.from_pretrained(path)
    assert model.config.model_type == name.split("_")[0]
    ids = make_ids(2, 12, seed=3)
    with torch.no_grad():
        want = t.hf(ids).logits
    assert (model.forward(ids).output - want).abs().max().item() < TOL


def test_gemma4_multimodal_wrapper_forward_is_the_reference(tmp_path, make_ids):
    """A tiny Gemma4ForConditionalGeneration saved by transformers (text only: no towers):
    our text forward equals the wrapper's own."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    from tests.support.tiny_families import _COMMON
    from tests.transformer.conftest import _randomise

    text = {**_COMMON, **GEMMA_FAMILIES["gemma4_text"][1], "max_position_embeddings": 64}
    torch.manual_seed(0)
    hf = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text, vision_config=None,
                                                     audio_config=None)).eval()
    hf.config.text_config._attn_implementation = "eager"
    _randomise(hf, 0)
    hf.save_pretrained(tmp_path / "g4mm")
    model = mi.MIModel.from_pretrained(tmp_path / "g4mm")
    ids = make_ids(2, 12, seed=3)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    assert (model.forward(ids).output - ref).abs().max().item() < TOL


def test_parsers_read_only_the_keys_their_family_declares(gemma):
    """As tests/transformer/test_transformer_docs.py does for the other tiny families."""
    from mi_transformer.config import FAMILIES, ConfigReader

    for name in NAMES:
        cfg = gemma(name).config
        family = FAMILIES[cfg["model_type"]]
        r = ConfigReader(cfg, "config.json")
        family.parse(r)
        assert not r.read - family.reads - {"model_type"}, name


# -- in-place edits --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gemma4_text", "gemma4_moe", "gemma3n_text"])
def test_an_inplace_edit_at_any_point_equals_returning_it(ours, make_ids, name):
    """Every point, the stream stacks and the per-layer inputs included (as
    tests/transformer/test_transformer_aliasing.py for the other families)."""
    from tests.support.inplace import inplace_mismatches

    torch.set_num_threads(1)
    bad = inplace_mismatches(ours(name), make_ids(2, 6, seed=1))
    assert not bad, "\n".join(bad)
