"""Quantized checkpoints that are not read are refused up front, naming their format.

NVIDIA ModelOpt exports keep their quantization in ``hf_quant_config.json`` beside a
config.json that may say nothing (the layout vLLM's ``modelopt.py`` and TensorRT-LLM read:
``{"producer": {"name": "modelopt", ...}, "quantization": {"quant_algo": "FP8",
"kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}``; NVFP4 adds
``"group_size": 16``); their tensors are float8 / packed FP4 weights with ``weight_scale``,
``weight_scale_2``, ``input_scale`` and ``self_attn.k_proj.k_scale`` / ``v_proj.v_scale``.
The checkpoints here are a tiny transformers LLaMA rewritten into those layouts (and into
GPTQ, bitsandbytes, compressed-tensors, block FP8 and MXFP4 tensor layouts with a config that
declares nothing). Only names, dtypes and shapes matter: each is refused before any weight is
read, so the stored values need not be a faithful quantization (the FP8 ones are)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

import mi_core as mi
from mi_cli.main import main
from mi_core.errors import ConfigError, UnsupportedModelError
from mi_core.registry import ModelSource
from mi_transformer.config import parse_config
from mi_transformer.loader import load_backend
from tests.transformer.conftest import make_tiny

FP8 = torch.float8_e4m3fn
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODELOPT_FP8 = {"producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                                 "exclude_modules": ["lm_head"]}}
MODELOPT_NVFP4 = {"producer": {"name": "modelopt", "version": "0.35.0"},
                  "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                   "group_size": 16, "exclude_modules": ["lm_head"]}}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("qrefuse"), "llama", "llama", {})


def _linears(sd: dict[str, torch.Tensor]) -> list[str]:
    return [n for n in sd if n.endswith(".weight") and any(f".{x}." in n for x in _LINEARS)]


def _modelopt_fp8(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ModelOpt FP8: weight / (amax / 448) as float8 with a scalar F32 ``weight_scale``, a
    scalar ``input_scale`` (static activation scale), and the KV-cache scales."""
    out = dict(sd)
    for n in _linears(sd):
        s = sd[n].abs().max() / 448.0
        base = n[: -len(".weight")]
        out[n] = (sd[n] / s).to(FP8)
        out[base + ".weight_scale"] = s.reshape(())
        out[base + ".input_scale"] = torch.tensor(0.02)
        if base.endswith(("k_proj", "v_proj")):
            out[f"{base}.{base[-6]}_scale"] = torch.tensor(1.0)  # k_proj.k_scale, v_proj.v_scale
    return out


def _modelopt_nvfp4(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ModelOpt NVFP4: two e2m1 codes a byte [out, in / 2], an FP8 scale per 16 inputs
    [out, in / 16], a global ``weight_scale_2`` and an ``input_scale``."""
    out = dict(sd)
    for n in _linears(sd):
        rows, cols = sd[n].shape
        base = n[: -len(".weight")]
        out[n] = torch.zeros(rows, cols // 2, dtype=torch.uint8)
        out[base + ".weight_scale"] = torch.ones(rows, cols // 16).to(FP8)
        out[base + ".weight_scale_2"] = torch.tensor(1e-3)
        out[base + ".input_scale"] = torch.tensor(1e-2)
    return out


def _gptq(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """GPTQ / AWQ: int4 codes packed 8 to an int32 (``qweight`` [in / 8, out]), ``qzeros``,
    ``scales`` per group of 32 inputs, ``g_idx``; no ``weight``."""
    out = {n: t for n, t in sd.items() if n not in _linears(sd)}
    for n in _linears(sd):
        rows, cols = sd[n].shape
        base = n[: -len(".weight")]
        out[base + ".qweight"] = torch.zeros(cols // 8, rows, dtype=torch.int32)
        out[base + ".qzeros"] = torch.zeros(cols // 32, rows // 8, dtype=torch.int32)
        out[base + ".scales"] = torch.ones(cols // 32, rows, dtype=torch.float16)
        out[base + ".g_idx"] = torch.arange(cols, dtype=torch.int32) // 32
    return out


def _bitsandbytes(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bitsandbytes 4-bit: packed bytes [n / 2, 1] and the quant state beside each weight."""
    out = dict(sd)
    for n in _linears(sd):
        out[n] = torch.zeros(sd[n].numel() // 2, 1, dtype=torch.uint8)
        out[n + ".absmax"] = torch.ones(sd[n].numel() // 64)
        out[n + ".quant_map"] = torch.linspace(-1, 1, 16)
        out[n + ".quant_state.bitsandbytes__nf4"] = torch.zeros(64, dtype=torch.uint8)
    return out


def _compressed_tensors(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """compressed-tensors pack-quantized: ``weight_packed`` int32, ``weight_scale``,
    ``weight_shape``; no ``weight``."""
    out = {n: t for n, t in sd.items() if n not in _linears(sd)}
    for n in _linears(sd):
        rows, cols = sd[n].shape
        base = n[: -len(".weight")]
        out[base + ".weight_packed"] = torch.zeros(rows, cols // 8, dtype=torch.int32)
        out[base + ".weight_scale"] = torch.ones(rows, cols // 32, dtype=torch.bfloat16)
        out[base + ".weight_shape"] = torch.tensor([rows, cols])
    return out


def _block_fp8(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Block-scaled FP8 (Qwen3-*-FP8's tensors) under a config without quantization_config."""
    out = dict(sd)
    for n in _linears(sd):
        out[n] = sd[n].to(FP8)
        out[n + "_scale_inv"] = torch.ones(1, 1)
    return out


def _mxfp4(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt-oss-style MXFP4 expert tensors under a config without quantization_config."""
    out = dict(sd)
    out["model.layers.0.mlp.experts.down_proj_blocks"] = torch.zeros(2, 64, 4, 16,
                                                                     dtype=torch.uint8)
    out["model.layers.0.mlp.experts.down_proj_scales"] = torch.zeros(2, 64, 4,
                                                                     dtype=torch.uint8)
    return out


def _write(t: Any, out: Path, rewrite: Callable[[dict[str, torch.Tensor]], dict],
           config: dict[str, Any] | None = None, sidecar: Any = None) -> Path:
    """`t`'s checkpoint rewritten by `rewrite` into `out` (config.json as transformers wrote
    it, or `config`; `sidecar` written as hf_quant_config.json when given)."""
    out.mkdir(parents=True)
    save_file(rewrite(load_file(str(t.path / "model.safetensors"))),
              str(out / "model.safetensors"), metadata={"format": "pt"})
    if config is None:
        shutil.copy(t.path / "config.json", out / "config.json")
    else:
        (out / "config.json").write_text(json.dumps(config))
    if sidecar is not None:
        (out / "hf_quant_config.json").write_text(
            sidecar if isinstance(sidecar, str) else json.dumps(sidecar))
    return out


def _refusal(path: Path, capsys) -> tuple[str, str]:
    """(from_pretrained's UnsupportedModelError, what `mi check` prints, exit status 1)."""
    with pytest.raises(UnsupportedModelError) as exc:
        mi.MIModel.from_pretrained(path)
    capsys.readouterr()
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "NOT supported" in out and "Traceback" not in out
    return str(exc.value), out


def test_modelopt_fp8_export_is_refused_naming_modelopt_its_algorithms_and_the_file(
        llama, tmp_path, capsys):
    path = _write(llama, tmp_path / "fp8", _modelopt_fp8, sidecar=MODELOPT_FP8)
    error, checked = _refusal(path, capsys)
    said = (f"{path / 'hf_quant_config.json'}: NVIDIA ModelOpt quantization (quant_algo 'FP8', "
            f"kv_cache_quant_algo 'FP8', producer modelopt 0.29.0) is not supported")
    assert said in error and said in checked
    # the plain refusal, not the tensors it would have listed as unexpected
    assert "unexpected" not in error and "unexpected" not in checked
    assert "model_type 'llama'" in error  # a supported family: no "no plugin implements"
    assert not error.startswith("no installed plugin implements")


def test_modelopt_export_is_refused_when_the_backend_is_named_too(llama, tmp_path):
    """``backend=`` skips detection; the loader refuses by itself."""
    path = _write(llama, tmp_path / "fp8", _modelopt_fp8, sidecar=MODELOPT_FP8)
    for load in (lambda: mi.MIModel.from_pretrained(path, backend="transformer"),
                 lambda: load_backend(ModelSource(path=path), torch.device("cpu"),
                                      torch.float32)):
        with pytest.raises(UnsupportedModelError, match="ModelOpt quantization .quant_algo "
                                                        "'FP8'.* is not supported"):
            load()


def test_modelopt_nvfp4_export_is_refused_naming_nvfp4_and_its_group_size(
        llama, tmp_path, capsys):
    path = _write(llama, tmp_path / "nvfp4", _modelopt_nvfp4, sidecar=MODELOPT_NVFP4)
    error, checked = _refusal(path, capsys)
    for text in (error, checked):
        assert "hf_quant_config.json: NVIDIA ModelOpt quantization (quant_algo 'NVFP4', " \
               "group_size 16, producer modelopt 0.35.0) is not supported" in text


def test_modelopt_kv_cache_quantization_alone_is_refused(llama, tmp_path):
    """``quant_algo: null`` with an FP8 KV cache: the weights are plain, but the runtimes
    quantize the KV cache with the stored k_scale / v_scale."""
    def kv_only(sd):
        out = dict(sd)
        for n in _linears(sd):
            if ".k_proj." in n or ".v_proj." in n:
                out[n[: -len("weight")] + f"{n.split('.')[-2][0]}_scale"] = torch.tensor(1.0)
        return out

    sidecar = {"producer": {"name": "modelopt"},
               "quantization": {"quant_algo": None, "kv_cache_quant_algo": "FP8"}}
    path = _write(llama, tmp_path / "kv", kv_only, sidecar=sidecar)
    with pytest.raises(UnsupportedModelError,
                       match="ModelOpt quantization .kv_cache_quant_algo 'FP8'"):
        mi.MIModel.from_pretrained(path)


def test_modelopt_flat_form_is_read_as_the_nested_one(llama, tmp_path):
    """vLLM also reads the keys of ``quantization`` at the top level of the file."""
    path = _write(llama, tmp_path / "flat", _modelopt_fp8,
                  sidecar={"quant_algo": "FP8", "kv_cache_quant_algo": None})
    with pytest.raises(UnsupportedModelError, match="ModelOpt quantization .quant_algo 'FP8'"):
        mi.MIModel.from_pretrained(path)


def test_hf_quant_config_that_declares_nothing_leaves_plain_weights_loading(llama, tmp_path,
                                                                            make_ids):
    path = _write(llama, tmp_path / "none", dict,
                  sidecar={"producer": {"name": "modelopt"},
                           "quantization": {"quant_algo": None, "kv_cache_quant_algo": None}})
    ids = make_ids(1, 8, seed=2)
    with torch.no_grad():
        want = llama.hf(ids).logits
    got = mi.MIModel.from_pretrained(path).forward(ids).output
    assert (got - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"quantization": "FP8"}'])
def test_malformed_hf_quant_config_is_a_config_error_naming_the_file(llama, tmp_path, text):
    path = _write(llama, tmp_path / "bad", dict, sidecar=text)
    with pytest.raises(ConfigError, match="hf_quant_config.json"):
        load_backend(ModelSource(path=path), torch.device("cpu"), torch.float32)
    with pytest.raises(UnsupportedModelError, match="hf_quant_config.json"):
        mi.MIModel.from_pretrained(path)  # detection gives the same reason


def test_modelopt_form_inside_config_json_is_refused_naming_its_algorithm(llama):
    """Newer ModelOpt exports also write ``quantization_config: {quant_method: "modelopt",
    quant_algo: ...}`` into config.json (the form vLLM reads as compressed-tensors style)."""
    cfg = {**llama.config, "quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
        "kv_cache_scheme": {"type": "float", "num_bits": 8}, "ignore": ["lm_head"]}}
    with pytest.raises(ConfigError, match="quant_method = 'modelopt': NVIDIA ModelOpt "
                                          "quantization .quant_algo 'NVFP4', group_size 16"):
        parse_config(cfg)
    cfg["quantization_config"] = {"quant_algo": "FP8", "producer": {"name": "modelopt"}}
    with pytest.raises(ConfigError, match="names no quant_method .*quant_algo 'FP8': NVIDIA "
                                          "ModelOpt's form"):
        parse_config(cfg)


@pytest.mark.parametrize("rewrite, likely", [
    (_modelopt_fp8, "FP8 with per-tensor / per-channel scales"),
    (_modelopt_nvfp4, "NVFP4 (ModelOpt: weight_scale_2)"),
    (_gptq, "GPTQ / AWQ"),
    (_bitsandbytes, "bitsandbytes"),
    (_compressed_tensors, "compressed-tensors"),
    (_block_fp8, "block-scaled FP8 (weight_scale_inv) without quantization_config.quant_method "
                 "'fp8'"),
    (_mxfp4, "MXFP4 (_blocks / _scales) without quantization_config.quant_method 'mxfp4'"),
], ids=["modelopt_fp8", "nvfp4", "gptq", "bitsandbytes", "compressed_tensors", "block_fp8",
        "mxfp4"])
def test_quantization_tensors_a_config_does_not_declare_name_the_likely_format(
        llama, tmp_path, capsys, rewrite, likely):
    path = _write(llama, tmp_path / "ckpt", rewrite)  # config.json as transformers wrote it
    error, checked = _refusal(path, capsys)
    said = f"{path}: quantized weights that its config.json does not declare, likely {likely}"
    assert said in error and said in checked
    assert "unexpected" not in error and "missing" not in error
    with pytest.raises(UnsupportedModelError, match="does not declare, likely"):  # backend=
        load_backend(ModelSource(path=path), torch.device("cpu"), torch.float32)


def test_quantization_tensors_of_an_unknown_model_type_name_the_format(llama, tmp_path, capsys):
    """An unknown model_type is tried as LLaMA-like from its tensors: GPTQ tensors are named
    as such, not listed as a layout that is not LLaMA's."""
    path = _write(llama, tmp_path / "gptq", _gptq, config={**llama.config,
                                                            "model_type": "my_llama"})
    error, checked = _refusal(path, capsys)
    assert error.startswith("no installed plugin implements model_type 'my_llama'")
    assert "does not declare, likely GPTQ / AWQ" in error
    assert "does not declare, likely GPTQ / AWQ" in checked
