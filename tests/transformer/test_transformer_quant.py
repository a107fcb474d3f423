"""Quantized checkpoints as published: block-scaled FP8 and MXFP4, dequantized at load.

References, per test: transformers' own dequantization of the same files (FP8: a tiny Qwen3
checkpoint quantized here the way Qwen3-*-FP8 / DeepSeek-V3 are stored, loaded by transformers
on CPU, where it dequantizes pre-quantized FP8 itself; MXFP4: transformers'
``convert_moe_packed_tensors``, the function its gpt-oss loading dequantizes with), and, where
transformers cannot run it (FP8 blocks that do not divide a weight: transformers derives the
block size from the scale grid and would use the wrong one), an independent block-by-block
implementation here. F32 logits: max abs diff < 1e-4; dequantized tensors: exactly equal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, WeightLoadError
from mi_transformer.config import parse_config
from mi_transformer.quant import (DequantizedSource, QuantConfig, dequantize_fp8,
                                  dequantize_mxfp4, read_quant_config)
from tests.transformer.conftest import make_tiny

TOL = 1e-4
FP8 = torch.float8_e4m3fn
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """w [rows, cols] -> (float8 e4m3 weight, scale_inv [ceil(rows/bh), ceil(cols/bw)]):
    each block divided by amax / 448 (e4m3's largest value), as DeepSeek's and Qwen's FP8
    checkpoints are made; edge blocks may be partial."""
    bh, bw = block
    rows, cols = w.shape
    scales = torch.empty(math.ceil(rows / bh), math.ceil(cols / bw))
    q = torch.empty(rows, cols, dtype=FP8)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            blk = w[i * bh:(i + 1) * bh, j * bw:(j + 1) * bw]
            s = blk.abs().max().clamp(min=1e-12) / 448.0
            scales[i, j] = s
            q[i * bh:(i + 1) * bh, j * bw:(j + 1) * bw] = (blk / s).to(FP8)
    return q, scales


def _dequantize_by_blocks(q: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]
                          ) -> torch.Tensor:
    """The independent reference: every block times its own scale, one block at a time."""
    bh, bw = block
    out = q.float().clone()
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            out[i * bh:(i + 1) * bh, j * bw:(j + 1) * bw] *= scales[i, j]
    return out


def _write_fp8(t, out: Path, block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Tiny checkpoint `t` as an FP8 checkpoint in `out`: every layer linear quantized in
    blocks, embeddings / norms / head as stored. Returns the F32 dequantized weights."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(t.path / "model.safetensors"))
    tensors, deq = {}, {}
    for name, w in sd.items():
        if name.endswith(".weight") and any(f".{lin}." in name for lin in _LINEARS):
            q, s = _quantize_blocks(w.float(), block)
            tensors[name], tensors[name + "_scale_inv"] = q, s
            deq[name] = _dequantize_by_blocks(q, s, block)
        else:
            tensors[name] = w
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((t.path / "config.json").read_text())
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                  "quant_method": "fp8", "weight_block_size": list(block)}
    (out / "config.json").write_text(json.dumps(cfg))
    return deq


@pytest.fixture(scope="module")
def qwen3_fp8(tmp_path_factory):
    """A tiny Qwen3 (every dimension a multiple of 16) stored as block-scaled FP8 (16 x 16)."""
    root = tmp_path_factory.mktemp("fp8")
    t = make_tiny(root, "qwen3", "qwen3", {"head_dim": 16})
    deq = _write_fp8(t, root / "qwen3_fp8", (16, 16))
    return t, root / "qwen3_fp8", deq


def test_fp8_logits_equal_transformers_dequantization_of_the_same_files(qwen3_fp8, make_ids):
    from transformers import AutoModelForCausalLM

    t, path, _ = qwen3_fp8
    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    assert ref.model.layers[0].self_attn.q_proj.weight.dtype == torch.float32  # dequantized
    ids = make_ids(2, 12, seed=3)
    model = mi.MIModel.from_pretrained(path)
    with torch.no_grad():
        want, unquantized = ref(ids).logits, t.hf(ids).logits
    got = model.forward(ids).output
    assert (got - want).abs().max().item() < TOL
    assert got.std().item() > 0.1
    # the FP8 rounding is really there: the unquantized checkpoint's logits differ
    assert (got - unquantized).abs().max().item() > 1e-2


def test_fp8_weights_are_the_block_by_block_dequantization(qwen3_fp8):
    _, path, deq = qwen3_fp8
    src = DequantizedSource(mi.plugin.SafetensorsCheckpoint.from_directory(path),
                            QuantConfig("fp8", (16, 16)), str(path))
    assert not any(n.endswith("_scale_inv") for n in src.names())
    for name, want in deq.items():
        assert torch.equal(src.get(name), want), name


def test_fp8_blocks_that_do_not_divide_the_weight_use_the_configured_block(tmp_path, make_ids):
    """Blocks of 64 over widths 96 and 16 (partial edge blocks, as DeepSeek-V3's 576-row
    kv_a_proj_with_mqa in blocks of 128). transformers would derive the block from the scale
    grid (96 / 2 = 48 rows) and dequantize wrongly, so the reference is the F32 checkpoint
    with every linear replaced by the block-by-block dequantization, run by transformers."""
    from transformers import AutoModelForCausalLM

    t = make_tiny(tmp_path, "llama", "llama", {})
    deq = _write_fp8(t, tmp_path / "fp8", (64, 64))
    ref = AutoModelForCausalLM.from_pretrained(str(t.path), dtype=torch.float32).eval()
    ref.load_state_dict({**ref.state_dict(), **deq})
    ids = make_ids(1, 10, seed=4)
    with torch.no_grad():
        want = ref(ids).logits
    got = mi.MIModel.from_pretrained(tmp_path / "fp8").forward(ids).output
    assert (got - want).abs().max().item() < TOL


def test_fp8_scale_grid_that_does_not_fit_is_a_weight_load_error_naming_it(qwen3_fp8, tmp_path):
    _, path, _ = qwen3_fp8
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [32, 32]  # the files hold 16 x 16 grids
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "model.safetensors").symlink_to(path / "model.safetensors")
    with pytest.raises(WeightLoadError, match=r"weight_scale_inv.*weight_block_size"):
        mi.MIModel.from_pretrained(bad)


def test_float8_weight_without_a_scale_is_refused(qwen3_fp8, tmp_path):
    from safetensors.torch import load_file, save_file

    _, path, _ = qwen3_fp8
    sd = load_file(str(path / "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.weight_scale_inv"]
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(sd, str(bad / "model.safetensors"))
    (bad / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(WeightLoadError, match=r"layers\.1\.mlp\.up_proj\.weight.*no "
                                              r"weight_scale_inv"):
        mi.MIModel.from_pretrained(bad)


def _ue8m0_copy(path: Path, out: Path, exact: bool) -> None:
    """The FP8 checkpoint at `path` re-quantized with power-of-two block scales (each rounded
    up to 2 ** ceil(log2 s), so the codes still fit e4m3) under DeepSeek-V3.1's
    ``scale_fmt: "ue8m0"``, scales stored as F32 as V3.1 publishes them; `exact` False
    perturbs one scale off its power of two."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(path / "model.safetensors"))
    for name in [n for n in sd if n.endswith("_scale_inv")]:
        w = name[: -len("_scale_inv")]
        deq = _dequantize_by_blocks(sd[w], sd[name], (16, 16))
        s = torch.exp2(torch.ceil(torch.log2(sd[name])))
        sd[name] = s
        sd[w] = (deq / s.repeat_interleave(16, 0).repeat_interleave(16, 1)).to(FP8)
    if not exact:
        sd["model.layers.0.mlp.down_proj.weight_scale_inv"][0, 0] *= 1.5
    out.mkdir()
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"]["scale_fmt"] = "ue8m0"
    (out / "config.json").write_text(json.dumps(cfg))


def test_fp8_ue8m0_scales_as_deepseek_v3_1_publishes_them_equal_transformers(
        qwen3_fp8, tmp_path, make_ids):
    """DeepSeek-V3.1's quantization_config declares ``scale_fmt: "ue8m0"`` (power-of-two
    block scales) over F32 weight_scale_inv tensors; transformers casts them to
    float8_e8m0fnu (exact) and dequantizes, and so must we."""
    from transformers import AutoModelForCausalLM

    _, path, _ = qwen3_fp8
    _ue8m0_copy(path, tmp_path / "ue8m0", exact=True)
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ue8m0"),
                                               dtype=torch.float32).eval()
    ids = make_ids(1, 10, seed=5)
    with torch.no_grad():
        want = ref(ids).logits
    got = mi.MIModel.from_pretrained(tmp_path / "ue8m0").forward(ids).output
    assert (got - want).abs().max().item() < TOL


def test_fp8_ue8m0_scale_that_is_not_a_power_of_two_is_a_weight_load_error(qwen3_fp8,
                                                                           tmp_path):
    _, path, _ = qwen3_fp8
    _ue8m0_copy(path, tmp_path / "bad", exact=False)
    with pytest.raises(WeightLoadError, match=r"ue8m0.*layers\.0\.mlp\.down_proj"):
        mi.MIModel.from_pretrained(tmp_path / "bad")


def test_dequantize_fp8_handles_partial_edge_blocks_and_stacked_weights():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, 40, 24, generator=g)  # two experts, blocks 16 x 16: 3 x 2 partial grid
    qs = [_quantize_blocks(w[e], (16, 16)) for e in range(2)]
    q, s = torch.stack([x[0] for x in qs]), torch.stack([x[1] for x in qs])
    got = dequantize_fp8(q, s, (16, 16))
    for e in range(2):
        assert torch.equal(got[e], _dequantize_by_blocks(qs[e][0], qs[e][1], (16, 16)))
    with pytest.raises(ValueError, match="scale grid"):
        dequantize_fp8(q, s[:, :2], (16, 16))


# ---------------------------------------------------------------------------- MXFP4

def _e2m1(code: int) -> float:
    """The OCP microscaling spec's FP4 (e2m1) value of a 4-bit code, from its bits."""
    sign = -1.0 if code & 8 else 1.0
    exp, man = (code >> 1) & 3, code & 1
    return sign * (man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2))


def _random_mxfp4(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (*shape, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(110, 140, shape, generator=g, dtype=torch.uint8)  # 2^-17 .. 2^12
    return blocks, scales


def test_mxfp4_equals_transformers_convert_moe_packed_tensors():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _random_mxfp4((3, 10, 4), seed=1)  # [experts, rows, groups]
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, 128, 10]
    got = dequantize_mxfp4(blocks, scales).transpose(1, 2)
    assert torch.equal(got, want)


def test_mxfp4_equals_the_bit_level_definition():
    blocks, scales = _random_mxfp4((2, 3), seed=2)
    got = dequantize_mxfp4(blocks, scales)
    for r in range(2):
        for g in range(3):
            for b in range(16):
                byte, scale = int(blocks[r, g, b]), 2.0 ** (int(scales[r, g]) - 127)
                lo, hi = got[r, g * 32 + 2 * b], got[r, g * 32 + 2 * b + 1]
                assert lo.item() == _e2m1(byte & 0xF) * scale
                assert hi.item() == _e2m1(byte >> 4) * scale


def test_mxfp4_checkpoint_reads_as_transformers_dequantized_expert_tensors():
    """`X_blocks` + `X_scales` of gpt-oss become `X` [experts, in, out], the layout of
    transformers' (and a BF16 checkpoint's) gate_up_proj / down_proj."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _random_mxfp4((2, 12, 2), seed=3)
    base = "model.layers.0.mlp.experts.gate_up_proj"
    other = torch.randn(12, 4)
    src = DequantizedSource(_Dict({base + "_blocks": blocks, base + "_scales": scales,
                                   "model.norm.weight": other}),
                            QuantConfig("mxfp4"), "<test>")
    assert src.shapes == {base: (2, 64, 12), "model.norm.weight": (12, 4)}
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(src.get(base), want)
    assert torch.equal(src.get("model.norm.weight"), other)


def test_mxfp4_blocks_without_scales_are_a_weight_load_error():
    blocks, _ = _random_mxfp4((2, 4, 2), seed=4)
    with pytest.raises(WeightLoadError, match="down_proj_blocks.*down_proj_scales"):
        DequantizedSource(_Dict({"x.down_proj_blocks": blocks}), QuantConfig("mxfp4"), "<test>")


class _Dict:
    """The smallest in-memory tensor source."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.shapes = {k: tuple(v.shape) for k, v in tensors.items()}


# --------------------------------------------------------------------- the config entry

def _llama_cfg(**extra) -> dict:
    return {"model_type": "llama", "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 32, **extra}


@pytest.mark.parametrize("method", ["awq", "gptq", "bitsandbytes", "compressed-tensors",
                                    "fbgemm_fp8", "nvfp4", "hqq", "eetq", "torchao", "quanto",
                                    "bitnet", "higgs", "vptq", "aqlm", "spqr", "fp_quant",
                                    "auto-round", "mxfp8"])
def test_other_quantization_methods_are_refused_by_name(method):
    cfg = _llama_cfg(quantization_config={"quant_method": method, "bits": 4})
    with pytest.raises(ConfigError, match=f"quant_method = '{method}' is not supported"):
        parse_config(cfg)


@pytest.mark.parametrize("flag", ["load_in_4bit", "load_in_8bit"])
def test_legacy_bitsandbytes_config_without_a_method_is_refused_naming_bitsandbytes(flag):
    """transformers 4 wrote ``{"load_in_8bit": true, ...}`` with no quant_method."""
    cfg = _llama_cfg(quantization_config={flag: True, "llm_int8_threshold": 6.0})
    with pytest.raises(ConfigError, match="quant_method = 'bitsandbytes' is not supported"):
        parse_config(cfg)


@pytest.mark.parametrize("key, value", [("activation_scheme", "static"), ("fmt", "e5m2"),
                                        ("scale_fmt", "e4m3"), ("weight_block_size", [128]),
                                        ("modules_to_convert", ["model.embed_tokens"]),
                                        ("unheard_of", 1)])
def test_fp8_settings_not_implemented_are_refused_naming_them(key, value):
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", key: value}
    with pytest.raises(ConfigError, match=key):
        read_quant_config({"quantization_config": qc}, "config.json")


@pytest.mark.parametrize("fmt", ["e4m3", "float8_e4m3fn"])
def test_fp8_format_is_accepted_in_both_published_spellings(fmt):
    """DeepSeek-V3 / Qwen3-*-FP8 say ``fmt: "e4m3"``, MiniMax-M2.5 (ai-dynamo/aiconfigurator's
    copy of its config.json) ``"float8_e4m3fn"``: torch's name of the same format."""
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": fmt,
          "weight_block_size": [128, 128]}
    assert read_quant_config({"quantization_config": qc}, "config.json").block == (128, 128)


def test_fp8_block_scales_declared_not_per_tensor_are_accepted_and_per_tensor_refused():
    """A Qwen3.5-MoE FP8 export says ``weight_per_tensor: false, act_per_tensor: false``
    (block scales, what is implemented); true, or a 0 standing for false, is refused."""
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_per_tensor": False,
          "act_per_tensor": False, "weight_block_size": [128, 128]}
    assert read_quant_config({"quantization_config": qc}, "config.json").method == "fp8"
    for key, value in (("weight_per_tensor", True), ("act_per_tensor", True),
                       ("weight_per_tensor", 0)):
        with pytest.raises(ConfigError, match=f"{key} = {value!r} is not supported"):
            read_quant_config({"quantization_config": {**qc, key: value}}, "config.json")


def test_quantization_config_without_a_method_is_refused_listing_its_keys():
    """ModelOpt's own form (``quant_algo``, ``producer``) names no quant_method."""
    qc = {"quant_algo": "FP8", "producer": {"name": "modelopt"}}
    with pytest.raises(ConfigError, match="names no quant_method .*producer, quant_algo"):
        parse_config(_llama_cfg(quantization_config=qc))


def test_transformers_gguf_marker_is_accepted_as_already_dequantized():
    qc = {"quant_method": "gguf", "gguf_file": "model.gguf", "dequantize": False}
    assert parse_config(_llama_cfg(quantization_config=qc)).model_type == "llama"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (unmeasured here)")
def test_fp8_checkpoint_on_cuda_gives_the_cpu_numbers(qwen3_fp8, make_ids):
    """Dequantization runs on the CPU and the weights move to the device like any other."""
    _, path, _ = qwen3_fp8
    ids = make_ids(1, 12, seed=6)
    cpu = mi.MIModel.from_pretrained(path).forward(ids).output
    gpu = mi.MIModel.from_pretrained(path, device="cuda").forward(ids.cuda()).output
    assert (gpu.cpu() - cpu).abs().max().item() < TOL
