"""Configs of gpt-oss, DeepSeek-V2/V3 and Llama 4 as published and as transformers writes them,
their neutral values, and gpt-oss's MXFP4 experts.

The published configs below are copied from the model repositories (URLs beside each); the
values the tests expect are derived from those dicts (no number comes from our parser). The
MXFP4 reference is transformers' own dequantization (``integrations/mxfp4.py``
``convert_moe_packed_tensors``), run on the same blocks and scales.
"""

from __future__ import annotations

import json
import math

import attrs
import pytest
import torch

import mi_core as mi
from mi_transformer.config import parse_config
from mi_transformer.quant import dequantize_mxfp4
from tests.support.tiny_families_moe2 import MOE2_FAMILIES, cached_moe2

# https://huggingface.co/openai/gpt-oss-20b/raw/main/config.json
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0",
    "use_cache": True, "vocab_size": 201088}

# https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/raw/main/config.json
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV2Config",
        "AutoModel": "modeling_deepseek.DeepseekV2Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_scaling": {
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 102400}

# https://huggingface.co/deepseek-ai/DeepSeek-V3/raw/main/config.json (FP8 weights: the
# quantization_config is another loader's; here the config without it)
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 129280}

_SCOUT_NOPE = [1, 1, 1, 0] * 12
# https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E/raw/main/config.json (vision_config
# shortened: it is not read)
LLAMA4_SCOUT = {
    "architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080,
    "eoi_token_index": 200081, "image_token_index": 200092, "model_type": "llama4",
    "text_config": {
        "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0,
        "attn_scale": 0.1, "attn_temperature_tuning": 4, "bos_token_id": 200000,
        "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192,
        "for_llm_compressor": False, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 5120, "initializer_range": 0.02, "interleave_moe_layer_step": 1,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "max_position_embeddings": 262144, "model_type": "llama4_text",
        "moe_layers": list(range(48)), "no_rope_layers": _SCOUT_NOPE,
        "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48,
        "num_key_value_heads": 8, "num_local_experts": 16, "output_router_logits": False,
        "pad_token_id": 200018, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
        "torch_dtype": "bfloat16", "use_cache": True, "use_qk_norm": True,
        "vocab_size": 202048},
    "tie_word_embeddings": False, "transformers_version": "4.51.0",
    "vision_config": {"hidden_size": 1408, "model_type": "llama4_vision_model",
                      "num_hidden_layers": 34}}


def test_published_gpt_oss_config_parses_with_its_sliding_layers_and_mxfp4_experts():
    c = parse_config(GPT_OSS_20B)
    assert c.layer_windows == (128, None) * 12 and c.attn_sinks
    assert c.moe.fused == "interleaved" and c.moe.expert_bias  # MXFP4: the loader's (quant.py)
    assert (c.moe.num_experts, c.moe.top_k, c.moe.swiglu_limit) == (32, 4, 7.0)
    rope = c.ropes[c.layer_rope[0]]
    assert (rope.factor, rope.original_max_positions, rope.truncate) == (32.0, 4096, False)


def test_published_deepseek_configs_parse_into_latent_attention():
    lite = parse_config(DEEPSEEK_V2_LITE)
    assert lite.mla.q_lora_rank is None and lite.mla.kv_lora_rank == 512
    assert lite.layer_moe == (False,) + (True,) * 26
    assert lite.moe.shared_expert_size == 2 * 1408 and lite.moe.plain_routing
    v3 = parse_config(DEEPSEEK_V3)
    assert v3.moe.scoring == "sigmoid" and (v3.moe.n_group, v3.moe.topk_group) == (8, 4)
    assert v3.ignored_layers == (61,) and v3.moe.routed_scaling == 2.5
    # transformers' softmax scale: (128 + 64)^-1/2 * (0.1 * mscale_all_dim * ln 40 + 1)^2
    m = 0.1 * 1.0 * math.log(40) + 1
    assert v3.attn_scale == pytest.approx(192 ** -0.5 * m * m)
    assert lite.attn_scale == pytest.approx(192 ** -0.5 * (0.1 * 0.707 * math.log(40) + 1) ** 2)


def test_published_llama4_scout_config_parses_its_language_model():
    """Scout's text_config says attn_temperature_tuning: 4 (transformers 4.51's integer
    spelling of true; transformers 5 refuses it)."""
    c = parse_config(LLAMA4_SCOUT)
    assert c.model_type == "llama4" and c.weight_names == "llama4_mm"
    assert c.layer_chunks == tuple(8192 if f else None for f in _SCOUT_NOPE)
    assert c.layer_use_rope == tuple(bool(f) for f in _SCOUT_NOPE)
    assert c.attn_temperature == (8192.0, 0.1) and all(c.layer_moe)
    assert c.layer_qk_norm == c.layer_use_rope and not c.qk_norm_affine


@pytest.mark.parametrize("base, key, value, match", [
    (DEEPSEEK_V2_LITE, "norm_topk_prob", True, "norm_topk_prob = True .*neutral value False"),
    (DEEPSEEK_V2_LITE, "moe_layer_freq", 2, "moe_layer_freq = 2 .*neutral value 1"),
    (DEEPSEEK_V2_LITE, "scoring_func", "sigmoid", "scoring_func"),
    (DEEPSEEK_V3, "topk_method", "greedy", "topk_method = 'greedy'"),
    (DEEPSEEK_V3, "num_key_value_heads", 0, "num_key_value_heads"),  # any value >= 1 reads
    (DEEPSEEK_V3, "qk_head_dim", 128, "qk_head_dim"),
    (GPT_OSS_20B, "experts_per_token", 2, "disagree"),
    (GPT_OSS_20B, "initial_context_length", 8192, "initial_context_length"),
    (GPT_OSS_20B, "quantization_config", {"quant_method": "awq"}, "'awq' is not supported"),
    (GPT_OSS_20B, "swiglu_limit", "7", "swiglu_limit"),
])
def test_a_value_that_would_change_the_numbers_is_refused_naming_it(base, key, value, match):
    with pytest.raises(mi.ConfigError, match=match):
        parse_config({**base, key: value})


def test_deepseek_num_key_value_heads_cannot_change_the_numbers_so_any_count_loads():
    """Latent attention expands k and v per head from the latent (transformers' default path
    gives the same logits at any num_key_value_heads; DeepSeek's own code never reads it)."""
    assert parse_config({**DEEPSEEK_V3, "num_key_value_heads": 64}).num_kv_heads == 128


def test_llama4_refuses_a_changed_neutral_value_inside_text_config():
    bad = {**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"],
                                           "for_llm_compressor": True}}
    with pytest.raises(mi.ConfigError, match="for_llm_compressor = True"):
        parse_config(bad)
    odd = {**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], "rope_x": 1}}
    with pytest.raises(mi.ConfigError, match="rope_x"):
        parse_config(odd)


@pytest.fixture(scope="module")
def moe2(tmp_path_factory):
    return cached_moe2(tmp_path_factory)


@pytest.mark.parametrize("name", list(MOE2_FAMILIES))
def test_the_config_transformers_writes_loads_as_saved_and_as_to_dict(moe2, name):
    """save_pretrained's config.json (the tiny checkpoints) and the config object's to_dict()
    parse to the same axes; every key read is one the family declares."""
    from mi_transformer.config import FAMILIES, ConfigReader

    t = moe2(name)
    saved = parse_config(t.config)
    assert parse_config(json.loads(json.dumps(t.hf.config.to_dict()))) == saved
    family = FAMILIES[t.config["model_type"]]
    r = ConfigReader(t.config, "config.json")
    family.parse(r)
    assert not (r.read - family.reads - {"model_type"})


# -- MXFP4 ------------------------------------------------------------------------------------

def _mxfp4(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random blocks [..., G, 16] and scales [..., G] (scales near 2^-3, so the weights are
    unit-scale like the tiny checkpoints')."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (*shape, 16), generator=g, dtype=torch.int64).to(torch.uint8)
    scales = torch.randint(122, 126, shape, generator=g, dtype=torch.int64).to(torch.uint8)
    return blocks, scales


def test_dequantize_mxfp4_equals_transformers_dequantization():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _mxfp4((3, 10, 4), 0)
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, cols, rows]
    got = dequantize_mxfp4(blocks, scales)  # [E, rows, cols]
    assert torch.equal(got.transpose(1, 2), ref)
    assert got.abs().max() > 0.1


def test_mxfp4_blocks_that_do_not_match_their_scales_are_refused():
    blocks, scales = _mxfp4((2, 3), 1)
    with pytest.raises(ValueError, match="do not match"):  # a WeightLoadError at load
        dequantize_mxfp4(blocks, scales[:, :2])


def test_gpt_oss_mxfp4_checkpoint_equals_transformers_on_its_dequantized_experts(
        moe2, tmp_path, make_ids):
    """The tiny gpt-oss with its experts replaced by MXFP4 blocks / scales, saved as
    published (``*_blocks``, ``*_scales``, quantization_config mxfp4); the reference is the
    transformers model holding transformers' dequantization of the same bytes."""
    import copy
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    t = moe2("gpt_oss")
    hf = copy.deepcopy(t.hf)
    shutil.copytree(t.path, tmp_path / "ck")
    tensors = load_file(str(tmp_path / "ck" / "model.safetensors"))
    d, f, e = 64, 32, 4
    for i, layer in enumerate(hf.model.layers):
        for k, (rows, cols) in enumerate([(2 * f, d), (d, f)]):
            proj = ("gate_up_proj", "down_proj")[k]
            blocks, scales = _mxfp4((e, rows, cols // 32), 10 * i + k)
            name = f"model.layers.{i}.mlp.experts.{proj}"
            del tensors[name]
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
            with torch.no_grad():
                getattr(layer.mlp.experts, proj).copy_(
                    convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    save_file(tensors, str(tmp_path / "ck" / "model.safetensors"))
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    cfg["quantization_config"] = GPT_OSS_20B["quantization_config"]
    (tmp_path / "ck" / "config.json").write_text(json.dumps(cfg))
    model = mi.MIModel.from_pretrained(tmp_path / "ck")
    ids = make_ids(2, 12, seed=5)
    with torch.no_grad():
        ref = hf(ids).logits
    assert (model.forward(ids).output - ref).abs().max().item() < 1e-4
    assert (ref - t.hf(ids).logits).abs().max().item() > 1e-2  # the experts really changed
    bad = dict(tensors)
    bad["model.layers.0.mlp.experts.down_proj_blocks"] = bad[
        "model.layers.0.mlp.experts.down_proj_blocks"][:, :32].contiguous()
    save_file(bad, str(tmp_path / "ck" / "model.safetensors"))
    with pytest.raises(mi.WeightLoadError, match="down_proj_blocks"):
        mi.MIModel.from_pretrained(tmp_path / "ck")
    bad = dict(tensors)  # a scale byte of 255 (e8m0's NaN): 2^128 overflows F32
    bad["model.layers.1.mlp.experts.down_proj_scales"] = torch.full_like(
        bad["model.layers.1.mlp.experts.down_proj_scales"], 255)
    save_file(bad, str(tmp_path / "ck" / "model.safetensors"))
    with pytest.raises(mi.WeightLoadError, match="NaN or inf.*down_proj"):
        mi.MIModel.from_pretrained(tmp_path / "ck")


def test_neutral_values_of_these_families_are_in_their_registry_tables():
    """families_moe2.NEUTRAL is data in each family's neutral table (the one the key policy
    reads and docs/BACKENDS.md's generated key table shows), beside the rotary layout."""
    from mi_transformer.config import FAMILIES
    from mi_transformer.config.families_moe2 import NEUTRAL
    from mi_transformer.keytable import key_table_markdown

    table = key_table_markdown()
    for model_type, values in NEUTRAL.items():
        assert dict(FAMILIES[model_type].neutral).items() >= values.items(), model_type
        row = next(line for line in table.splitlines() if line.startswith(f"| `{model_type}` |"))
        for key in values:
            assert f"`{key}` = " in row, (model_type, key)
    assert FAMILIES["deepseek_v3"].neutral["rope_interleaved"] is True
    assert FAMILIES["gpt_oss"].neutral["rope_interleaved"] is False


def test_llama3_rope_with_equal_frequency_factors_is_transformers_step():
    """Llama-4-Scout as published: llama3 RoPE with low_freq_factor = high_freq_factor = 1.0
    (no medium band; transformers only warns). The inverse frequencies equal transformers'."""
    from transformers import Llama4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from mi_transformer.config import parse_config
    from mi_transformer.rope import inv_freq

    scaling = {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
               "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}
    hf = Llama4TextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, num_hidden_layers=4, rope_theta=500000.0,
                          rope_scaling=scaling)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf)
    c = parse_config(hf.to_dict(), "config.json")
    got = inv_freq(c.ropes[c.layer_rope[0]], 16)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    smooth = attrs.evolve(c.ropes[c.layer_rope[0]], high_freq_factor=4.0)
    assert got.isfinite().all() and not torch.equal(got, inv_freq(smooth, 16))


@pytest.mark.parametrize("arch", ["granitehybrid", "nemotron_h", "qwen3next", "qwen35"])
def test_gguf_of_the_hybrid_families_is_read(arch):
    """The hybrids' GGUF architectures, once refused with a pointer to safetensors, are read
    (parity: test_transformer_gguf_hybrids.py); none is refused that way any more."""
    from mi_transformer.gguf import GGUF_ARCHES
    from mi_transformer.gguf.arches import SAFETENSORS_ONLY

    assert arch in GGUF_ARCHES and not SAFETENSORS_ONLY


def test_deepseek_v3_as_published_in_fp8_equals_transformers_dequantization(tmp_path, moe2,
                                                                             make_ids):
    """DeepSeek-V3 is published block-scaled FP8 (its latent projections, attention output and
    every expert; router and norms as stored): the tiny V3 written that way loads through
    quant.py with transformers' own dequantization's logits (F32, < 1e-4). Blocks of 8 divide
    every tiny dimension: transformers' CPU dequantization mis-scales partial edge blocks
    (q_lora_rank 24 in blocks of 16; quant.py's partial blocks are tested against an
    independent reference in test_transformer_quant.py)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from tests.transformer.test_transformer_quant import _quantize_blocks

    t = moe2("deepseek_v3")
    linears = (".q_a_proj.", ".q_b_proj.", ".kv_a_proj_with_mqa.", ".kv_b_proj.", ".o_proj.",
               ".gate_proj.", ".up_proj.", ".down_proj.")
    tensors = {}
    for name, w in load_file(str(t.path / "model.safetensors")).items():
        if name.endswith(".weight") and any(k in name for k in linears):
            tensors[name], tensors[name + "_scale_inv"] = _quantize_blocks(w.float(), (8, 8))
        else:
            tensors[name] = w
    assert sum(n.endswith("_scale_inv") for n in tensors) > 20
    out = tmp_path / "v3_fp8"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(t.config, quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3",
                                              "quant_method": "fp8",
                                              "weight_block_size": [8, 8]})
    (out / "config.json").write_text(json.dumps(cfg))
    ref = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = make_ids(2, 12, seed=5)
    with torch.no_grad():
        want, unquantized = ref(ids).logits, t.hf(ids).logits
    got = mi.MIModel.from_pretrained(out).forward(ids).output
    assert (got - want).abs().max().item() < 1e-4
    assert (got - unquantized).abs().max().item() > 1e-3  # the FP8 rounding is really there
