"""GGUF files of the architectures issue 21 adds: gptneox, falcon, phi2, stablelm, command-r,
granite, olmoe, gemma3 — written here with the `gguf` package's GGUFWriter as llama.cpp's
convert_hf_to_gguf.py writes them.

Tensor names come from ``gguf.get_tensor_name_map`` (the package's own HF -> GGUF table, an
independent reference for our reverse map), and the converter's changes are redone here:
NeoX's per-head q/k/v rows and Falcon's per-KV-group rows regrouped as [q | k | v], StableLM's
per-head q/k norms stacked [heads, head_dim], Granite's q/k rows permuted (LlamaModel), Gemma
3's norm gains stored as 1 + w, OLMoE's experts stacked. Metadata as the converter writes it
(Falcon's and Phi-2's feed_forward_length of 4 x d_model and Falcon's context of 2048
included), plus ``rope.freq_base`` where a converter writes none but llama.cpp reads one (the
tiny models use bases away from 10000 so that a wrong base shows). Reference: transformers on
the source safetensors checkpoint. F32 logits: max abs diff < 1e-4.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import mi_core as mi
from mi_core.errors import UnsupportedModelError
from mi_transformer.gguf import read_gguf
from tests.support.byte_tokens import gpt2_byte_tokens
from tests.support.tiny_families import FAMILIES, HEADS, WINDOW
from tests.transformer.conftest import make_tiny

gguf = pytest.importorskip("gguf")
TOL = 1e-4
_GEMMA3 = {"head_dim": 16, "query_pre_attn_scalar": 16, "num_hidden_layers": 6,
           "sliding_window": WINDOW, "layer_types": None}

#: name -> (GGUF arch, tiny family, config overrides). llama.cpp's Gemma 3 scales scores by
#: head_dim**-0.5 (query_pre_attn_scalar = head_dim) and its default pattern is five sliding
#: layers then a global one; its Phi-2 converter writes head_count_kv = heads (no GQA).
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gptneox": ("gptneox", "gpt_neox", {}),
    "gptneox_sequential": ("gptneox", "gpt_neox_sequential", {}),
    "falcon_7b": ("falcon", "falcon_7b", {}),
    "falcon_new_decoder": ("falcon", "falcon_new_decoder", {}),
    "phi2": ("phi2", "phi", {"num_key_value_heads": HEADS}),
    "stablelm": ("stablelm", "stablelm", {}),
    "stablelm_parallel": ("stablelm", "stablelm_parallel", {}),
    "stablelm_qk_norm": ("stablelm", "stablelm_qk_norm", {}),
    "command_r": ("command-r", "cohere", {}),
    "command_r_qk_norm": ("command-r", "cohere_qk_norm", {}),
    "granite": ("granite", "granite", {}),
    "olmoe": ("olmoe", "olmoe", {}),
    "gemma3": ("gemma3", "gemma3_text", _GEMMA3),
    "gemma3_pattern": ("gemma3", "gemma3_text", {
        **_GEMMA3, "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
}


def _hp(cfg: Any) -> dict[str, Any]:
    """The HF config as convert_hf_to_gguf reads it (hparams), rope base included."""
    d = cfg.to_dict()
    rp = d.get("rope_parameters") or {}
    rp = rp.get("full_attention", rp)
    d["rope_theta"] = rp.get("rope_theta", 10000.0)
    d["partial_rotary_factor"] = rp.get("partial_rotary_factor",
                                        d.get("partial_rotary_factor", 1.0))
    return d


def _metadata(arch: str, hp: dict[str, Any], n_ff: int) -> dict[str, tuple[Any, str]]:
    """``{key: (value, GGUFValueType)}`` of each converter's set_gguf_parameters."""
    d, h = hp["hidden_size"], hp["num_attention_heads"]
    kv_heads = hp.get("num_key_value_heads") or h
    hd = hp.get("head_dim") or d // h
    u = lambda v: (v, "UINT32")  # noqa: E731
    f = lambda v: (float(v), "FLOAT32")  # noqa: E731
    kv = {"context_length": u(hp.get("max_position_embeddings", 2048)),
          "embedding_length": u(d), "block_count": u(hp["num_hidden_layers"]),
          "feed_forward_length": u(n_ff), "attention.head_count": u(h),
          "rope.freq_base": f(hp["rope_theta"])}
    if arch in ("gptneox", "phi2", "stablelm"):  # partial rotary, LayerNorm
        kv["rope.dimension_count"] = u(int(hp["partial_rotary_factor"] * hd))
        kv["attention.layer_norm_epsilon"] = f(hp["layer_norm_eps"])
    if arch == "gptneox":
        kv["use_parallel_residual"] = (hp["use_parallel_residual"], "BOOL")
    if arch == "stablelm":
        kv["use_parallel_residual"] = (hp["use_parallel_residual"], "BOOL")
        kv["attention.head_count_kv"] = u(kv_heads)
    if arch == "phi2":
        kv.update({"feed_forward_length": u(4 * d), "attention.head_count_kv": u(h)})
    if arch == "falcon":
        kv.update({"context_length": u(2048), "feed_forward_length": u(4 * d),
                   "attention.head_count_kv": u(hp["num_kv_heads"] if
                                                hp["new_decoder_architecture"] else 1),
                   "attention.layer_norm_epsilon": f(hp["layer_norm_epsilon"]),
                   "tensor_data_layout": ("jploski", "STRING")})
    if arch in ("command-r", "granite", "olmoe", "gemma3"):  # TextModel's generic keys
        kv["attention.head_count_kv"] = u(kv_heads)
        if hp.get("head_dim"):
            kv["attention.key_length"] = kv["attention.value_length"] = u(hp["head_dim"])
    if arch == "command-r":
        kv.update({"attention.layer_norm_epsilon": f(hp["layer_norm_eps"]),
                   "logit_scale": f(hp["logit_scale"])})
    if arch in ("granite", "olmoe", "gemma3"):
        kv["attention.layer_norm_rms_epsilon"] = f(hp["rms_norm_eps"])
    if arch == "granite":
        kv.update({"rope.dimension_count": u(hd), "attention.scale":
                   f(hp["attention_multiplier"]), "embedding_scale":
                   f(hp["embedding_multiplier"]), "residual_scale": f(hp["residual_multiplier"]),
                   "logit_scale": f(hp["logits_scaling"])})
    if arch == "olmoe":
        kv.update({"expert_count": u(hp["num_experts"]),
                   "expert_used_count": u(hp["num_experts_per_tok"])})
        if hp.get("clip_qkv"):
            kv["attention.clamp_kqv"] = f(hp["clip_qkv"])
    if arch == "gemma3":
        kv["attention.sliding_window"] = u(hp["sliding_window"])
    return {f"{arch}.{k}": v for k, v in kv.items()}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (Granite inherits it)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _regroup(w: np.ndarray, hp: dict[str, Any], arch: str) -> np.ndarray:
    """NeoX's per-head and Falcon's per-KV-group q/k/v rows as [q | k | v], as the converters
    (GPTNeoXModel.modify_tensors, FalconModel.modify_tensors) rearrange them."""
    h, d = hp["num_attention_heads"], hp["hidden_size"]
    hd = d // h
    tail = w.shape[1:]
    if arch == "gptneox":
        g = w.reshape(h, 3, hd, *tail)
        return np.concatenate([g[:, j].reshape(h * hd, *tail) for j in range(3)])
    kv = hp["num_kv_heads"] if hp["new_decoder_architecture"] else 1
    g = w.reshape(kv, h // kv + 2, hd, *tail)
    return np.concatenate([g[:, :-2].reshape(h * hd, *tail), g[:, -2].reshape(kv * hd, *tail),
                           g[:, -1].reshape(kv * hd, *tail)])


def _tensors(arch: str, sd: dict[str, torch.Tensor], hp: dict[str, Any]
             ) -> list[tuple[str, np.ndarray]]:
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper().replace("-", "_")],
                                     hp["num_hidden_layers"])
    out, stacks = [], {}
    for hf, tensor in sd.items():
        if hf == "lm_head.weight" and hp.get("tie_word_embeddings"):
            continue
        a = tensor.float().numpy()
        m = re.fullmatch(r"(model\.layers\.\d+)\.(mlp\.experts)\.(\d+)\.(\w+)\.weight", hf) or \
            re.fullmatch(r"(model\.layers\.\d+)\.(self_attn\.[qk]_layernorm)\.norms\.(\d+)"
                         r"\.(weight)", hf)
        if m:  # stacked by the converter: experts [E, rows, cols], per-head norms [h, d_head]
            key = f"{m[1]}.{m[2]}.{m[4]}" if "experts" in hf else f"{m[1]}.{m[2]}.weight"
            stacks.setdefault(key, {})[int(m[3])] = a
            continue
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf
        out.append((name, _convert(arch, name, a, hp)))
    for key, per in stacks.items():
        name = names.get_name(key, try_suffixes=(".weight",))
        assert name is not None, key
        suffix = "" if name.endswith(".weight") else ".weight"
        out.append((name + suffix, np.stack([per[i] for i in sorted(per)])))
    return out


def _convert(arch: str, name: str, a: np.ndarray, hp: dict[str, Any]) -> np.ndarray:
    if arch in ("gptneox", "falcon") and ".attn_qkv." in name:
        return _regroup(a, hp, arch)
    if arch == "granite" and name.endswith("attn_q.weight"):
        return _permute(a, hp["num_attention_heads"])
    if arch == "granite" and name.endswith("attn_k.weight"):
        return _permute(a, hp["num_key_value_heads"])
    if arch == "gemma3" and name.endswith("norm.weight"):
        return a + 1  # Gemma3Model.norm_shift
    return a


def write_gguf(t: Any, arch: str, out: Path, meta: dict[str, Any] | None = None) -> Path:
    """Tiny checkpoint `t` as llama.cpp's converter writes a GGUF of `arch`; `meta` adds or
    replaces metadata ``{key: (value, GGUFValueType name)}``."""
    from safetensors.torch import load_file

    hp = _hp(t.hf.config)
    sd = load_file(str(t.path / "model.safetensors"))
    n_ff = hp.get("intermediate_size") or hp.get("ffn_hidden_size")
    kv = {**_metadata(arch, hp, n_ff), **(meta or {})}
    w = gguf.GGUFWriter(str(out), arch)
    for key, (value, vtype) in kv.items():
        if value is not None:
            w.add_key_value(key, value, gguf.GGUFValueType[vtype])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(gpt2_byte_tokens(hp["vocab_size"]))
    w.add_token_types([1] * hp["vocab_size"])
    for name, a in _tensors(arch, sd, hp):
        w.add_tensor(name, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    made: dict[str, tuple[Any, Path]] = {}
    root = tmp_path_factory.mktemp("gguf_more")

    def get(name: str) -> tuple[Any, Path]:
        if name not in made:
            arch, tiny, over = CASES[name]
            model_type, base = FAMILIES[tiny]
            (root / name).mkdir()
            t = make_tiny(root / name, tiny, model_type, {**base, **over})
            meta = None
            if name == "gemma3_pattern":  # llama.cpp's per-layer pattern key (true: sliding)
                meta = {"gemma3.attention.sliding_window_pattern": ([True, False, True],
                                                                    "ARRAY")}
            made[name] = (t, write_gguf(t, arch, root / f"{name}.gguf", meta))
        return made[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_logits_equal_transformers_on_the_source_checkpoint(case, make_ids, name):
    t, path = case(name)
    model = mi.MIModel.from_pretrained(path)
    assert model.config.model_type == t.hf.config.model_type
    ids = make_ids(2, 12, seed=43)
    with torch.no_grad():
        ref = t.hf(ids).logits
    got = model.forward(ids).output
    assert (got - ref).abs().max().item() < TOL
    assert got.std().item() > 0.1


@pytest.mark.parametrize("name", ["gptneox", "falcon_new_decoder", "stablelm_qk_norm"])
def test_gguf_tensors_are_the_source_tensors(case, name):
    """F32 round trip: every tensor back bit-identical under its HF name, re-laid out where
    llama.cpp regrouped it (NeoX / Falcon q/k/v, StableLM per-head norms)."""
    from safetensors.torch import load_file

    t, path = case(name)
    ckpt = read_gguf(path)
    ref = load_file(str(t.path / "model.safetensors"))
    if t.hf.config.tie_word_embeddings:
        ref.pop("lm_head.weight", None)
    assert set(ckpt.tensors) == set(ref)
    for k, v in ref.items():
        assert torch.equal(ckpt.tensors[k], v), k


def test_falcon_feed_forward_width_comes_from_the_tensors(case):
    """The converter writes 4 x d_model as feed_forward_length; the tiny model has 96."""
    t, path = case("falcon_7b")
    assert read_gguf(path).config["ffn_hidden_size"] == t.hf.config.ffn_hidden_size != 4 * 64


def test_rotary_width_that_the_family_cannot_express_is_refused(case, tmp_path):
    t, _ = case("stablelm")
    bad = write_gguf(t, "stablelm", tmp_path / "bad.gguf",
                     {"stablelm.rope.dimension_count": (18, "UINT32")})  # head_dim 16
    with pytest.raises(mi.MIError, match="rope.dimension_count"):
        read_gguf(bad)


def test_an_architecture_no_plugin_implements_is_refused_plainly(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "bloom")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError,
                       match="^no installed plugin implements GGUF architecture 'bloom'"):
        read_gguf(tmp_path / "x.gguf")


def test_plugin_lists_the_new_architectures():
    from mi_transformer import plugin

    listed = set(plugin._GGUF.split(", "))
    assert {"gptneox", "falcon", "phi2", "stablelm", "command-r", "granite", "olmoe",
            "gemma3"} <= listed
