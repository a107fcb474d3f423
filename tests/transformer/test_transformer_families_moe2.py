"""gpt-oss, DeepSeek-V2/V3 and Llama 4 text against transformers.

Reference: the tiny random checkpoints of tests/support/tiny_families_moe2.py loaded by
transformers (eager attention, F32; sinks, latents, routers, chunks and temperatures away from
their defaults). Tolerance: max abs diff < 1e-4 on logits, the embedding, every layer's
residual stream and attention pattern (transformers' ``output_attentions``), router logits and
latents; routing indices and greedy tokens exactly equal.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import mi_core as mi
from tests.support.family_checks import assert_left_padding_rows_alone, assert_matches_transformers
from tests.support.hf_reference import assert_matches_hf_with_hook
from tests.support.tiny_families_moe2 import MOE2_FAMILIES, cached_moe2

TOL = 1e-4
NAMES = list(MOE2_FAMILIES)
#: one of each kind of attention and router (the variants' differences are in the parity test)
CORE = ["gpt_oss", "deepseek_v2", "deepseek_v3", "llama4_text"]


@pytest.fixture(scope="module")
def moe2(tmp_path_factory):
    return cached_moe2(tmp_path_factory)


@pytest.fixture(scope="module")
def ours(moe2):
    models: dict[str, mi.MIModel] = {}

    def get(name: str) -> mi.MIModel:
        if name not in models:
            models[name] = moe2(name).load()
        return models[name]

    return get


@pytest.mark.parametrize("name", NAMES)
def test_family_matches_transformers(moe2, make_ids, name):
    assert_matches_transformers(moe2(name), make_ids(2, 16, seed=41))


@pytest.mark.parametrize("name", CORE)
def test_left_padding_rows_equal_running_alone(ours, make_ids, name):
    assert_left_padding_rows_alone(ours(name), [make_ids(1, 14, seed=5)[0],
                                                make_ids(1, 8, seed=6)[0]])


@pytest.mark.parametrize("name", ["gpt_oss", "deepseek_v2_lite", "deepseek_v3", "llama4_text"])
def test_greedy_generation_equals_transformers(moe2, ours, make_ids, name):
    """8 prompt + 10 new tokens with the KV cache: past the window, chunk and yarn length."""
    t, model = moe2(name), ours(name)
    ids = make_ids(2, 8, seed=7)
    got = model.generate(ids, max_new_tokens=10, stop_at_eos=False)
    with torch.no_grad():
        ref = copy.deepcopy(t.hf).generate(ids, attention_mask=torch.ones_like(ids),
                                           max_new_tokens=10, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(got.tokens, ref)


def test_layer_types_say_which_layers_slide_or_chunk(ours):
    assert ours("gpt_oss").layer_types == ["sliding_attention", "full_attention",
                                           "sliding_attention"]
    assert ours("llama4_text").layer_types == ["chunked_attention", "full_attention",
                                               "chunked_attention"]
    assert ours("deepseek_v3").layer_types == ["full_attention"] * 3
    assert ours("gpt_oss").config.layer_windows == (5, None, 5)
    assert ours("llama4_text").config.layer_chunks == (4, None, 4)


# -- gpt-oss: attention sinks ----------------------------------------------------------------

def test_sinks_point_holds_the_checkpoints_sinks_and_the_pattern_misses_their_share(
        moe2, ours, make_ids):
    """hook_sinks [heads] is the sink logit; the pattern over real keys sums to 1 - the
    sink's softmax share, computed here from the captured scores."""
    model, hf = ours("gpt_oss"), moe2("gpt_oss").hf
    pts = ["blocks.1.attn.hook_sinks", "blocks.1.attn.hook_attn_scores",
           "blocks.1.attn.hook_pattern"]
    cache = model.forward(make_ids(2, 9, seed=2), mi.HookSpec().capture_all(pts))
    sinks = cache[pts[0]]
    assert sinks.shape == (4,) == model.backend.hook_shape(pts[0], 2, 9)
    torch.testing.assert_close(sinks, hf.model.layers[1].self_attn.sinks.detach(), atol=0, rtol=0)
    scores, pattern = cache[pts[1]], cache[pts[2]]
    share = torch.softmax(torch.cat([scores, sinks.view(1, 4, 1, 1).expand(2, 4, 9, 1)], -1),
                          -1)[..., -1]
    torch.testing.assert_close(pattern.sum(-1), 1 - share, atol=1e-6, rtol=0)
    assert share.min().item() > 1e-3  # the sinks really take a share


def test_sinks_intervention_equals_transformers_with_changed_sinks(moe2, ours, make_ids):
    """Replace at hook_sinks changes the softmax as transformers does with other sinks; a very
    negative sink removes it (pattern rows sum to 1)."""
    model, t = ours("gpt_oss"), moe2("gpt_oss")
    ids = make_ids(1, 10, seed=3)
    new = torch.tensor([2.0, -1.0, 0.5, -30.0])
    got = model.forward(ids, mi.HookSpec().intervene("blocks.0.attn.hook_sinks",
                                                     mi.Replace(new))).output
    attn = t.hf.model.layers[0].self_attn
    old = attn.sinks.detach().clone()
    try:
        with torch.no_grad():
            attn.sinks.copy_(new)
            ref = t.hf(ids).logits
    finally:
        with torch.no_grad():
            attn.sinks.copy_(old)
    assert (got - ref).abs().max().item() < TOL
    assert (got - model.forward(ids).output).abs().max().item() > 1e-3
    off = model.forward(ids, mi.HookSpec().intervene("blocks.0.attn.hook_sinks",
                                                     mi.Replace(torch.full((4,), -1e4)))
                        .capture("blocks.0.attn.hook_pattern"))
    rows = off["blocks.0.attn.hook_pattern"].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-6, rtol=0)


def test_sink_layers_take_the_explicit_path_even_when_sdpa_is_forced(ours, make_ids):
    model, ids = ours("gpt_oss"), make_ids(2, 12, seed=4)
    torch.testing.assert_close(model.forward(ids, attn_impl="sdpa").output,
                               model.forward(ids, attn_impl="explicit").output, atol=0, rtol=0)


# -- DeepSeek: latent attention --------------------------------------------------------------

@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v2_lite", "deepseek_v3"])
def test_latent_points_equal_transformers_latents(moe2, ours, make_ids, name):
    """hook_kv_latent is kv_a_layernorm's output, hook_q_latent q_a_layernorm's (absent
    without a q latent); q / k / v / z have MLA's widths."""
    model, hf = ours(name), moe2(name).hf
    ids = make_ids(2, 7, seed=8)
    seen: dict[str, torch.Tensor] = {}
    attn = hf.model.layers[2].self_attn
    handles = [attn.kv_a_layernorm.register_forward_hook(
        lambda m, i, o: seen.__setitem__("kv", o.detach()))]
    if attn.q_a_layernorm is not None:
        handles.append(attn.q_a_layernorm.register_forward_hook(
            lambda m, i, o: seen.__setitem__("q", o.detach())))
    try:
        with torch.no_grad():
            hf(ids)
    finally:
        for h in handles:
            h.remove()
    names = {p.name for p in model.hook_points()}
    pts = ["blocks.2.attn.hook_kv_latent", "blocks.2.attn.hook_q", "blocks.2.attn.hook_k",
           "blocks.2.attn.hook_v", "blocks.2.attn.hook_z"]
    has_q = "q" in seen
    assert ("blocks.2.attn.hook_q_latent" in names) == has_q
    assert "blocks.2.hook_attn_in" not in names and "blocks.2.hook_q_input" not in names
    if has_q:
        pts.append("blocks.2.attn.hook_q_latent")
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    assert (cache[pts[0]] - seen["kv"]).abs().max().item() < TOL
    if has_q:
        assert (cache["blocks.2.attn.hook_q_latent"] - seen["q"]).abs().max().item() < TOL
        assert cache["blocks.2.attn.hook_q_latent"].shape == (2, 7, 24)
    assert cache[pts[0]].shape == (2, 7, 16)
    assert cache[pts[1]].shape == cache[pts[2]].shape == (2, 7, 4, 16)
    assert cache[pts[3]].shape == cache[pts[4]].shape == (2, 7, 4, 12)
    for p in pts:
        assert model.backend.hook_shape(p, 2, 7) == tuple(cache[p].shape)
    k = cache[pts[2]]  # the rotary part of the key is one vector shared by every head
    assert torch.equal(k[..., 8:], k[:, :, :1, 8:].expand_as(k[..., 8:]))


def test_kv_latent_intervention_equals_transformers_with_the_same_change(moe2, ours, make_ids):
    model, hf = ours("deepseek_v3"), moe2("deepseek_v3").hf
    ids = make_ids(1, 9, seed=9)
    delta = 0.5 * torch.randn(16, generator=torch.Generator().manual_seed(0))
    got = model.forward(ids, mi.HookSpec().intervene("blocks.1.attn.hook_kv_latent",
                                                     mi.Add(delta))).output
    assert_matches_hf_with_hook(got, hf, ids, hf.model.layers[1].self_attn.kv_a_layernorm,
                                lambda m, i, o: o + delta)


def test_mla_weights_refuse_the_per_head_projections_but_give_w_o(ours):
    model = ours("deepseek_v2")
    with pytest.raises(mi.WeightLoadError, match="latent attention"):
        model.backend.get_weight("W_Q", 0)
    assert model.backend.get_weight("W_O", 0).shape == (4, 12, 64)


def test_mtp_layers_of_the_checkpoint_are_ignored(moe2, tmp_path, make_ids):
    """DeepSeek-V3 checkpoints store their multi-token-prediction module as layer
    num_hidden_layers (num_nextn_predict_layers 1): loaded without it, as transformers."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    t = moe2("deepseek_v3")
    shutil.copytree(t.path, tmp_path / "ck")
    tensors = load_file(str(tmp_path / "ck" / "model.safetensors"))
    tensors.update({k.replace("layers.2.", "layers.3."): v.clone() for k, v in tensors.items()
                    if k.startswith("model.layers.2.")})
    save_file(tensors, str(tmp_path / "ck" / "model.safetensors"))
    model = mi.MIModel.from_pretrained(tmp_path / "ck")
    ids = make_ids(1, 6, seed=1)
    torch.testing.assert_close(model.forward(ids).output, t.load().forward(ids).output)
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 0
    (tmp_path / "ck" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(mi.WeightLoadError, match="layers up to index 3"):
        mi.MIModel.from_pretrained(tmp_path / "ck")


# -- routers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CORE)
def test_router_points_equal_transformers_router(moe2, ours, make_ids, name):
    """hook_router_logits equals transformers' router logits; the chosen experts equal
    transformers' (as sets: transformers' top-k is unsorted) and the weights renormalise or
    scale as the family says."""
    t, model = moe2(name), ours(name)
    ids = make_ids(2, 12, seed=22)
    picked: dict[int, torch.Tensor] = {}
    handles = [_record_router(layer, i, picked) for i, layer in enumerate(t.hf.model.layers)]
    try:
        with torch.no_grad():
            ref = t.hf(ids, output_router_logits=True).router_logits
    finally:
        for h in handles:
            if h is not None:
                h.remove()
    moe_layers = [i for i, f in enumerate(model.config.layer_moe) if f]
    assert len(ref) == len(moe_layers) >= 1
    c = model.config.moe
    pts = [f"blocks.{i}.mlp.hook_{k}" for i in moe_layers
           for k in ("router_logits", "expert_weights", "expert_indices")]
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    for i, r in zip(moe_layers, ref):
        logits = cache[f"blocks.{i}.mlp.hook_router_logits"].reshape(-1, c.num_experts)
        assert (logits - r).abs().max().item() < TOL
        idx = cache[f"blocks.{i}.mlp.hook_expert_indices"].reshape(-1, c.top_k)
        assert torch.equal(idx.sort(-1).values, picked[i].sort(-1).values)


def _record_router(layer, i, picked):
    """A forward hook recording the experts transformers' router picks in `layer`."""
    mlp = getattr(layer, "mlp", None) or getattr(layer, "feed_forward", None)
    router = getattr(mlp, "gate", None) or getattr(mlp, "router", None)
    if router is None:
        return None

    def hook(m, inp, out):
        if isinstance(out, tuple) and len(out) == 3:  # (logits, weights, indices)
            picked[i] = out[2].detach()
        else:  # Llama 4: (scores [tokens, E] with zeros where not chosen, logits)
            k = m.top_k
            picked[i] = torch.topk(out[1], k, dim=-1).indices.detach()

    return router.register_forward_hook(hook)


def test_llama4_routing_weight_scales_the_experts_input(ours, make_ids):
    """Llama 4 multiplies each expert's input by its sigmoid score: an expert's contribution
    is then not score x output (as in the other families)."""
    model = ours("llama4_text")
    pts = ["blocks.1.mlp.experts.0.hook_out", "blocks.1.mlp.hook_expert_weights",
           "blocks.1.mlp.hook_expert_indices", "blocks.1.mlp.hook_in"]
    cache = model.forward(make_ids(1, 10, seed=12), mi.HookSpec().capture_all(pts))
    w, idx, x = cache[pts[1]][0], cache[pts[2]][0], cache[pts[3]][0]
    expert = model.backend.w.layers[1].mlp.experts[0]
    act = torch.nn.functional.silu
    for t in range(10):
        hit = (idx[t] == 0).nonzero()
        if len(hit):
            s = w[t, hit[0, 0]]
            torch.testing.assert_close(cache[pts[0]][0, t], expert((x[t] * s)[None], act)[0])
            assert not torch.allclose(cache[pts[0]][0, t], s * expert(x[t][None], act)[0])
            assert 0 < s.item() < 1  # sigmoid of the logit, not renormalised


def test_gpt_oss_swiglu_clamp_is_reached(moe2, ours, make_ids):
    """The tiny config's limit (0.5) clamps: without the clamp the numbers would differ."""
    model = ours("gpt_oss")
    expert = model.backend.w.layers[0].mlp.experts[0]
    x = model.forward(make_ids(1, 12, seed=1), mi.HookSpec().capture(
        "blocks.0.mlp.hook_in"))["blocks.0.mlp.hook_in"][0]
    gu = x @ expert.gate_up + expert.gate_up_bias
    assert gu.abs().max().item() > 0.5


@pytest.mark.parametrize("name", ["gpt_oss", "deepseek_v3"])
def test_bfloat16_error_is_no_worse_than_transformers_in_bfloat16(moe2, make_ids, name):
    """As tests/transformer/test_transformer_parity.py: our bf16 logits at most twice as far
    from the f32 reference as transformers' own bf16 forward (routers, norms, softmax, the
    sink softmax in float32; DeepSeek-V3's router and selection bias loaded in float32)."""
    from mi_core.registry import ModelSource
    from mi_transformer.loader import load_backend

    t = moe2(name)
    be = load_backend(ModelSource(path=t.path), torch.device("cpu"), torch.bfloat16)
    ids = make_ids(2, 12, seed=5)
    got = mi.MIModel(be).forward(ids).output
    with torch.no_grad():
        ref32 = t.hf(ids).logits
        ref16 = copy.deepcopy(t.hf).to(torch.bfloat16)(ids).logits
    assert got.dtype == torch.bfloat16
    hf_err = (ref16.float() - ref32).abs().max().item()
    assert (got.float() - ref32).abs().max().item() <= 2 * hf_err + 1e-3


def test_llama4_multimodal_checkpoint_loads_its_language_model(tmp_path, make_ids):
    """A tiny Llama4ForConditionalGeneration saved the hub way (language_model.*,
    vision_model.*, multi_modal_projector.*): the text forward equals transformers'."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    from tests.support.tiny_families_moe2 import MOE2_FAMILIES as F
    from tests.transformer.conftest import _randomise

    text = dict(F["llama4_text"][1], hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14, vision_output_dim=32,
                  projector_input_dim=32, projector_output_dim=32)
    torch.manual_seed(0)
    hf = Llama4ForConditionalGeneration(Llama4Config(text_config=text, vision_config=vision))
    hf.config.text_config._attn_implementation = "eager"
    _randomise(hf.eval(), 0)
    hf.save_pretrained(tmp_path / "l4mm")
    model = mi.MIModel.from_pretrained(tmp_path / "l4mm")
    assert model.config.model_type == "llama4" and model.layer_types[1] == "full_attention"
    ids = make_ids(2, 12, seed=3)
    with torch.no_grad():
        # The wrapper's own text-only call fails in transformers 5.24 (it reads
        # `image_outputs` off its language model's output); its language model is the
        # same weights and the same text forward, so it is the reference.
        ref = hf.language_model(input_ids=ids).logits
    assert (model.forward(ids).output - ref).abs().max().item() < TOL
    # the config object's to_dict() (every attribute) loads with the same numbers
    d = tmp_path / "to_dict"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf.config.to_dict()))
    (d / "model.safetensors").symlink_to(tmp_path / "l4mm" / "model.safetensors")
    got = mi.MIModel.from_pretrained(d).forward(ids).output
    assert (got - ref).abs().max().item() < TOL
