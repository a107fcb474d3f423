"""GGUF files of every supported architecture (llama, qwen2, qwen3, gemma, gemma2, phi3,
starcoder2, olmo2, gpt2, qwen2moe, qwen3moe), written here with the `gguf` package's
GGUFWriter the way llama.cpp's convert_hf_to_gguf.py writes them.

Tensor names come from ``gguf.get_tensor_name_map`` (the package's own HF -> GGUF table, an
independent reference for our reverse map); the converter's changes are redone here: LLaMA's
q/k row permutation, Gemma's norm gains stored as 1 + w, Phi-3's longrope factors as tensors.
Reference: transformers on the source safetensors checkpoint. F32 tensors; logits max abs
diff < 1e-4. Malformed metadata (and hypothesis-fuzzed values) must raise an MIError.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError
from mi_transformer.gguf import read_gguf
from tests.support.byte_tokens import gpt2_byte_tokens
from tests.support.tiny_families import FAMILIES, GPT_FAMILIES, WINDOW
from tests.transformer.conftest import make_tiny

gguf = pytest.importorskip("gguf")
TOL = 1e-4

#: name -> (gguf arch, model_type, HF overrides). Gemma 2: llama.cpp scales scores by
#: head_dim**-0.5, so the HF side uses query_pre_attn_scalar = head_dim.
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("llama", "llama", {}),
    "qwen2": ("qwen2", "qwen2", {"tie_word_embeddings": False}),
    "qwen2_tied": ("qwen2", "qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", "qwen3", {"head_dim": 16}),
    "gemma": ("gemma", "gemma", {"head_dim": 16}),
    "gemma2": ("gemma2", "gemma2", {"head_dim": 16, "sliding_window": WINDOW,
                                    "query_pre_attn_scalar": 16, "attn_logit_softcapping": 2.0,
                                    "final_logit_softcapping": 5.0}),
    "phi3": ("phi3", "phi3", {}),
    "phi3_longrope": ("phi3", "phi3", FAMILIES["phi3_longrope"][1]),
    "qwen2_yarn": ("qwen2", "qwen2", FAMILIES["qwen2_yarn"][1]),
    "gpt2": ("gpt2", "gpt2", GPT_FAMILIES["gpt2"][1]),
    "starcoder2": ("starcoder2", "starcoder2", {}),
    "olmo2": ("olmo2", "olmo2", FAMILIES["olmo2"][1]),
    # llama.cpp's qwen2moe has no dense layers (mlp_only_layers), qwen3moe renormalises
    "qwen2moe": ("qwen2moe", "qwen2_moe", {**FAMILIES["qwen2_moe"][1], "mlp_only_layers": []}),
    "qwen3moe": ("qwen3moe", "qwen3_moe", FAMILIES["qwen3_moe"][1]),
    "mixtral": ("llama", "mixtral", FAMILIES["mixtral"][1]),  # llama.cpp: llama + experts
}


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py), reimplemented independently."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(t: Any, arch: str, out: Path, meta: dict[str, Any] | None = None,
               drop_meta: tuple[str, ...] = ()) -> Path:
    """The tiny HF checkpoint `t` as a GGUF of `arch`. `meta`: extra or replacement metadata
    ``{key: (value, GGUFValueType)}``; `drop_meta`: keys not to write."""
    from safetensors.torch import load_file

    if arch == "gpt2":
        return _write_gpt2(t, out, meta)
    cfg = t.hf.config
    kv = _metadata(cfg, arch)
    kv.update(meta or {})
    w = gguf.GGUFWriter(str(out), arch)
    for key, (value, vtype) in kv.items():
        if key not in drop_meta:
            w.add_key_value(key, value, gguf.GGUFValueType[vtype])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(gpt2_byte_tokens(cfg.vocab_size))
    w.add_token_types([1] * cfg.vocab_size)
    _add_tensors(w, load_file(str(t.path / "model.safetensors")), cfg, arch)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _metadata(cfg: Any, arch: str) -> dict[str, tuple[Any, str]]:
    """The metadata convert_hf_to_gguf writes for a LLaMA-like HF config:
    ``{key: (value, GGUFValueType name)}``."""
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = {f"{arch}.context_length": (cfg.max_position_embeddings, "UINT32"),
          f"{arch}.embedding_length": (cfg.hidden_size, "UINT32"),
          f"{arch}.feed_forward_length": (cfg.intermediate_size, "UINT32"),
          f"{arch}.block_count": (cfg.num_hidden_layers, "UINT32"),
          f"{arch}.attention.head_count": (cfg.num_attention_heads, "UINT32"),
          f"{arch}.attention.head_count_kv": (cfg.num_key_value_heads, "UINT32"),
          f"{arch}.attention.key_length": (hd, "UINT32"),
          f"{arch}.attention.value_length": (hd, "UINT32"),
          f"{arch}.rope.dimension_count": (hd, "UINT32"),
          f"{arch}.rope.freq_base": (cfg.rope_parameters["rope_theta"], "FLOAT32"),
          f"{arch}.attention.layer_norm_rms_epsilon": (getattr(cfg, "rms_norm_eps", 1e-6),
                                                       "FLOAT32"),
          f"{arch}.vocab_size": (cfg.vocab_size, "UINT32")}
    if arch == "starcoder2":
        kv[f"{arch}.attention.layer_norm_epsilon"] = (cfg.norm_epsilon, "FLOAT32")
    if arch == "gemma2":
        kv[f"{arch}.attn_logit_softcapping"] = (cfg.attn_logit_softcapping, "FLOAT32")
        kv[f"{arch}.final_logit_softcapping"] = (cfg.final_logit_softcapping, "FLOAT32")
        kv[f"{arch}.attention.sliding_window"] = (cfg.sliding_window, "UINT32")
    rp = cfg.rope_parameters
    if rp.get("rope_type") == "yarn":  # llama.cpp's yarn keys (convert_hf_to_gguf)
        kv[f"{arch}.rope.scaling.type"] = ("yarn", "STRING")
        kv[f"{arch}.rope.scaling.factor"] = (rp["factor"], "FLOAT32")
        kv[f"{arch}.rope.scaling.original_context_length"] = (
            rp["original_max_position_embeddings"], "UINT32")
    if rp.get("rope_type") == "longrope":
        kv[f"{arch}.rope.scaling.original_context_length"] = (
            rp["original_max_position_embeddings"], "UINT32")
    if arch.endswith("moe") or hasattr(cfg, "num_local_experts"):
        n_exp = getattr(cfg, "num_experts", None) or cfg.num_local_experts
        kv[f"{arch}.expert_count"] = (n_exp, "UINT32")
        kv[f"{arch}.expert_used_count"] = (cfg.num_experts_per_tok, "UINT32")
        kv[f"{arch}.expert_feed_forward_length"] = (
            getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size, "UINT32")
        if getattr(cfg, "shared_expert_intermediate_size", 0):
            kv[f"{arch}.expert_shared_feed_forward_length"] = (
                cfg.shared_expert_intermediate_size, "UINT32")
    return kv


def _add_tensors(w: Any, sd: dict[str, torch.Tensor], cfg: Any, arch: str) -> None:
    """The checkpoint's tensors under llama.cpp's names (``gguf.get_tensor_name_map``), changed
    as convert_hf_to_gguf changes them: longrope factors as tensors, LLaMA's q/k rows
    permuted, Gemma's norm gains as 1 + w, experts stacked [E, rows, cols]."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    rp = cfg.rope_parameters
    if rp.get("rope_type") == "longrope":
        w.add_tensor("rope_factors_long.weight", np.asarray(rp["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rp["short_factor"], np.float32))
    experts: dict[str, dict[int, np.ndarray]] = {}
    for hf, tensor in sd.items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        m = re.fullmatch(r"(model\.layers\.\d+\.\w+\.experts)\.(\d+)\.(\w+)\.weight", hf)
        if m:  # llama.cpp stacks the experts: [E, rows, cols] per projection
            experts.setdefault(f"{m[1]}.{m[3]}", {})[int(m[2])] = tensor.float().numpy()
            continue
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf
        a = tensor.float().numpy()
        if arch == "llama" and name.endswith("attn_q.weight"):
            a = _llama_cpp_permute(a, cfg.num_attention_heads)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            a = _llama_cpp_permute(a, cfg.num_key_value_heads)
        if arch in ("gemma", "gemma2") and "norm" in name:
            a = a + 1  # convert_hf_to_gguf's GemmaModel / Gemma2Model.modify_tensors
        if name.endswith("ffn_gate_inp_shexp.weight"):
            a = a.reshape(-1)  # stored as [d_model]
        w.add_tensor(name, np.ascontiguousarray(a))
    for hf, per in experts.items():
        name = names.get_name(hf, try_suffixes=(".weight",))
        assert name is not None, hf
        stacked = np.stack([per[e] for e in sorted(per)])
        w.add_tensor(name + ".weight", np.ascontiguousarray(stacked))


def _write_gpt2(t: Any, out: Path, meta: dict[str, Any] | None) -> Path:
    """GPT-2 as convert_hf_to_gguf's GPT2Model writes it: Conv1D weights transposed to
    [out, in], the tied embedding written a second time as output.weight."""
    from safetensors.torch import load_file

    cfg = t.hf.config
    sd = load_file(str(t.path / "model.safetensors"))
    w = gguf.GGUFWriter(str(out), "gpt2")
    kv = {"gpt2.context_length": (cfg.n_positions, "UINT32"),
          "gpt2.embedding_length": (cfg.n_embd, "UINT32"),
          "gpt2.feed_forward_length": (cfg.n_inner or 4 * cfg.n_embd, "UINT32"),
          "gpt2.block_count": (cfg.n_layer, "UINT32"),
          "gpt2.attention.head_count": (cfg.n_head, "UINT32"),
          "gpt2.attention.layer_norm_epsilon": (cfg.layer_norm_epsilon, "FLOAT32")}
    kv.update(meta or {})
    for key, (value, vtype) in kv.items():
        w.add_key_value(key, value, gguf.GGUFValueType[vtype])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(gpt2_byte_tokens(cfg.vocab_size))
    w.add_token_types([1] * cfg.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, cfg.n_layer)
    for hf, tensor in sd.items():
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf
        a = tensor.float().numpy()
        if a.ndim == 2 and name.startswith("blk."):
            a = a.T
        w.add_tensor(name, np.ascontiguousarray(a))
        if name == "token_embd.weight":
            w.add_tensor("output.weight", np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    made: dict[str, tuple[Any, Path]] = {}
    root = tmp_path_factory.mktemp("gguf_arches")

    def get(name: str) -> tuple[Any, Path]:
        if name not in made:
            arch, mt, over = CASES[name]
            t = make_tiny(root, name, mt, over)
            made[name] = (t, write_gguf(t, arch, root / f"{name}.gguf"))
        return made[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_logits_equal_transformers_on_the_source_checkpoint(case, make_ids, name):
    t, path = case(name)
    ids = make_ids(2, 16, seed=41)
    model = mi.MIModel.from_pretrained(path)
    assert model.config.model_type == CASES[name][1]
    with torch.no_grad():
        ref = t.hf(ids).logits
    got = model.forward(ids).output
    assert (got - ref).abs().max().item() < TOL
    assert got.std().item() > 0.1


@pytest.mark.parametrize("name", ["qwen2", "gemma2", "phi3"])
def test_gguf_tensors_are_the_source_tensors(case, name):
    """F32 round trip: every tensor comes back bit-identical under its HF name (Gemma's
    norms: 1 + w - 1, exact for these values up to one rounding)."""
    from safetensors.torch import load_file

    t, path = case(name)
    ckpt = read_gguf(path)
    ref = load_file(str(t.path / "model.safetensors"))
    if t.hf.config.tie_word_embeddings:
        ref.pop("lm_head.weight", None)
    assert set(ckpt.tensors) == set(ref)
    for k, v in ref.items():
        assert (ckpt.tensors[k] - v).abs().max().item() <= (1e-6 if "norm" in k else 0), k


def test_phi3_longrope_factor_tensors_become_rope_scaling(case):
    t, path = case("phi3_longrope")
    rs = read_gguf(path).config["rope_scaling"]
    rp = t.hf.config.rope_parameters
    assert rs["rope_type"] == "longrope"
    assert rs["long_factor"] == pytest.approx(rp["long_factor"])
    assert rs["short_factor"] == pytest.approx(rp["short_factor"])


@pytest.mark.parametrize("key, value, vtype", [
    ("qwen2.embedding_length", "64", "STRING"),
    ("qwen2.attention.head_count", 4.0, "FLOAT32"),
    ("qwen2.block_count", [3, 3], "ARRAY"),
    ("qwen2.rope.freq_base", "1e4", "STRING"),
    ("qwen2.attention.layer_norm_rms_epsilon", -1.0, "FLOAT32"),
    ("qwen2.context_length", True, "BOOL"),
])
def test_metadata_of_the_wrong_type_is_a_config_error_naming_the_key(case, tmp_path, key,
                                                                    value, vtype):
    t, _ = case("qwen2")
    path = write_gguf(t, "qwen2", tmp_path / "bad.gguf", meta={key: (value, vtype)})
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        read_gguf(path)


def test_missing_required_metadata_is_a_config_error_naming_the_key(case, tmp_path):
    t, _ = case("qwen3")
    path = write_gguf(t, "qwen3", tmp_path / "bad.gguf", drop_meta=("qwen3.block_count",))
    with pytest.raises(ConfigError, match=r"qwen3\.block_count"):
        read_gguf(path)


@pytest.mark.slow
def test_fuzzed_metadata_values_fail_only_with_mi_errors(case, tmp_path_factory):
    """Any value of any GGUF type at any architecture key either loads or raises an MIError
    (never a TypeError / KeyError / IndexError from deep inside)."""
    from tests.support.gguf_fuzz import fuzz_metadata

    t, good = case("gemma2")
    keys = [k for k in read_gguf(good).metadata if k.startswith("gemma2.")]
    fuzz_metadata(keys, lambda path, meta: write_gguf(t, "gemma2", path, meta=meta), read_gguf,
                  tmp_path_factory.mktemp("fuzz"), examples=40)


def test_plugin_lists_exactly_the_gguf_architectures_read():
    """Detection reads this list: an architecture the reader maps but the list lacks would
    be refused before the reader is asked (gemma3n / gemma4 are mapped by arches_gemma)."""
    from mi_transformer import plugin
    from mi_transformer.gguf import GGUF_ARCHES
    from mi_transformer.gguf.arches_gemma import GEMMA_GGUF

    assert sorted(plugin._GGUF.split(", ")) == sorted(set(GGUF_ARCHES) | set(GEMMA_GGUF))


@pytest.mark.parametrize("layers, hidden, heads, want", [
    (46, 4608, 32, 144),  # Gemma 2 27B: its hub config.json says query_pre_attn_scalar 144
    (26, 2304, 8, 256),  # Gemma 2 2B: 256 (= head_dim), as llama.cpp's key_length scaling
])
def test_gemma2_gguf_attention_scale_follows_llama_cpp(layers, hidden, heads, want):
    from mi_transformer.gguf import GgufHeader, hf_config

    md = {"general.architecture": "gemma2", "gemma2.block_count": layers,
          "gemma2.embedding_length": hidden, "gemma2.attention.head_count": heads,
          "gemma2.attention.head_count_kv": heads // 2, "gemma2.attention.key_length": 128
          if layers == 46 else 256, "gemma2.attention.value_length": 128 if layers == 46
          else 256, "gemma2.feed_forward_length": 4 * hidden, "gemma2.vocab_size": 256}
    cfg = hf_config(GgufHeader(Path("x.gguf"), 3, md, [], 0, 0))
    assert cfg["query_pre_attn_scalar"] == want
