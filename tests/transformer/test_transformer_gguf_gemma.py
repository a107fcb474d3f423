"""GGUF files of Gemma-3n (``gemma3n``) and Gemma-4 (``gemma4``, dense and MoE), written here
with the `gguf` package's GGUFWriter the way llama.cpp's convert_hf_to_gguf.py
(``Gemma3NModel``, ``Gemma4Model`` on ``Gemma3Model`` and ``TextModel``) writes them.

Tensor names come from ``gguf.get_tensor_name_map`` (the package's own HF -> GGUF table, an
independent reference for our reverse map); the converter's changes are redone here:
``_scale`` / ``layer_scalar`` / stacked-expert names suffixed ``.weight``, AltUp's stream
projections stacked [3, d, d], the per-layer table padded to the vocabulary with zero rows,
activation sparsity as its Gaussian quantile, the router's scales as ``ffn_gate_inp.scale`` /
``ffn_down_exps.scale``, proportional RoPE as a ``rope_freqs`` tensor (1 then 1e30), per-layer
KV heads and MLP widths as arrays. Reference: transformers on the source safetensors
checkpoint (F32; logits max abs diff < 1e-4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import mi_core as mi
from tests.support.byte_tokens import gpt2_byte_tokens
from tests.support.tiny_families_gemma import GEMMA_FAMILIES, make_gemma

gguf = pytest.importorskip("gguf")
TOL = 1e-4

#: llama.cpp converts Gemma-3n with 4 AltUp streams only; a per-layer table as wide as the
#: vocabulary (the padded case is its own test)
_G3N = dict(GEMMA_FAMILIES["gemma3n_text"][1], altup_num_inputs=4,
            vocab_size_per_layer_input=128)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gemma3n": ("gemma3n", "gemma3n_text", _G3N),
    "gemma3n_padded": ("gemma3n", "gemma3n_text", dict(_G3N, vocab_size_per_layer_input=100)),
    "gemma4": ("gemma4", "gemma4_text", GEMMA_FAMILIES["gemma4_text"][1]),
    "gemma4_moe": ("gemma4", "gemma4_text", GEMMA_FAMILIES["gemma4_moe"][1]),
}


def _metadata(d: dict[str, Any], arch: str) -> dict[str, tuple[Any, str]]:
    """What convert_hf_to_gguf writes for these configs (`d`: config.json as saved, whose
    global_head_dim transformers writes as per_layer_config): ``{key: (value, type name)}``."""
    a = arch
    cfg = _Attrs(d)
    types = cfg.layer_types
    rp = cfg.rope_parameters
    kv: dict[str, tuple[Any, str]] = {
        f"{a}.block_count": (cfg.num_hidden_layers, "UINT32"),
        f"{a}.context_length": (cfg.max_position_embeddings, "UINT32"),
        f"{a}.embedding_length": (cfg.hidden_size, "UINT32"),
        f"{a}.attention.head_count": (cfg.num_attention_heads, "UINT32"),
        f"{a}.attention.head_count_kv": (cfg.num_key_value_heads, "UINT32"),
        f"{a}.rope.freq_base": (rp["full_attention"]["rope_theta"], "FLOAT32"),
        f"{a}.rope.freq_base_swa": (rp["sliding_attention"]["rope_theta"], "FLOAT32"),
        f"{a}.attention.layer_norm_rms_epsilon": (cfg.rms_norm_eps, "FLOAT32"),
        f"{a}.attention.key_length": (cfg.head_dim, "UINT32"),
        f"{a}.attention.value_length": (cfg.head_dim, "UINT32"),
        f"{a}.final_logit_softcapping": (cfg.final_logit_softcapping, "FLOAT32"),
        f"{a}.attention.sliding_window": (cfg.sliding_window, "UINT32"),
        f"{a}.attention.shared_kv_layers": (cfg.num_kv_shared_layers, "UINT32"),
        f"{a}.embedding_length_per_layer_input": (cfg.hidden_size_per_layer_input or 0,
                                                  "UINT32"),
        f"{a}.attention.sliding_window_pattern": ([t == "sliding_attention" for t in types],
                                                  "ARRAY")}
    if arch == "gemma3n":
        normal = torch.distributions.normal.Normal(0, 1)
        kv.update({
            f"{a}.feed_forward_length": (list(cfg.intermediate_size), "ARRAY"),
            f"{a}.altup_active_idx": (cfg.altup_active_idx, "UINT32"),
            f"{a}.altup_num_inputs": (cfg.altup_num_inputs, "UINT32"),
            f"{a}.activation_sparsity_scale": ([normal.icdf(torch.tensor(
                s, dtype=torch.float32)).item() for s in cfg.activation_sparsity_pattern],
                "ARRAY")})
        return kv
    glob = _full_layer(cfg)
    n, first_shared = cfg.num_hidden_layers, cfg.num_hidden_layers - cfg.num_kv_shared_layers
    kv.update({f"{a}.attention.key_length": (glob.head_dim, "UINT32"),
               f"{a}.attention.value_length": (glob.head_dim, "UINT32"),
               f"{a}.attention.key_length_swa": (cfg.head_dim, "UINT32"),
               f"{a}.attention.value_length_swa": (cfg.head_dim, "UINT32"),
               f"{a}.rope.dimension_count": (glob.head_dim, "UINT32"),
               f"{a}.rope.dimension_count_swa": (cfg.head_dim, "UINT32"),
               f"{a}.feed_forward_length": (cfg.intermediate_size, "UINT32")})
    if cfg.use_double_wide_mlp:
        kv[f"{a}.feed_forward_length"] = ([cfg.intermediate_size * (1 if i < first_shared else 2)
                                           for i in range(n)], "ARRAY")
    if glob.num_key_value_heads != cfg.num_key_value_heads:
        kv[f"{a}.attention.head_count_kv"] = ([
            cfg.num_key_value_heads if t == "sliding_attention" else glob.num_key_value_heads
            for t in types], "ARRAY")
    if cfg.enable_moe_block:
        kv.update({f"{a}.expert_count": (cfg.num_experts, "UINT32"),
                   f"{a}.expert_used_count": (cfg.top_k_experts, "UINT32"),
                   f"{a}.expert_feed_forward_length": (cfg.moe_intermediate_size, "UINT32")})
    return kv


class _Attrs:
    """config.json keys as attributes (the per-layer overrides too, as transformers' per-layer
    view gives them)."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)


def _full_layer(cfg: Any) -> Any:
    """A full layer's head size and KV heads (its per_layer_config entry over the globals)."""
    i = next(i for i, t in enumerate(cfg.layer_types) if t == "full_attention")
    over = (getattr(cfg, "per_layer_config", None) or {}).get(str(i), {})
    return _Attrs({"head_dim": cfg.head_dim, "num_key_value_heads": cfg.num_key_value_heads,
                   **over})


def _tensors(sd: dict[str, torch.Tensor], cfg: Any, arch: str
             ) -> list[tuple[str, np.ndarray]]:
    """The checkpoint's tensors under llama.cpp's names, changed as the converter does."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    out: list[tuple[str, np.ndarray]] = []
    stacks: dict[str, dict[int, np.ndarray]] = {}
    for hf, tensor in sd.items():
        a = tensor.float().numpy()
        if hf.endswith(("embed_tokens.weight", "embed_tokens_per_layer.weight")) and \
                arch == "gemma3n" and a.shape[0] < cfg.vocab_size:  # zero rows to the vocab
            a = np.concatenate([a, np.zeros((cfg.vocab_size - a.shape[0], a.shape[1]),
                                            np.float32)])
        if ".altup_projections." in hf or ".altup_unembed_projections." in hf:
            base, j = hf.rsplit(".", 2)[0], int(hf.rsplit(".", 2)[1])
            stacks.setdefault(base, {})[j] = a
            continue
        if hf.endswith("router.scale"):
            out.append((f"blk.{hf.split('.')[2]}.ffn_gate_inp.scale", a))
            continue
        if hf.endswith("router.per_expert_scale"):
            out.append((f"blk.{hf.split('.')[2]}.ffn_down_exps.scale", a))
            continue
        if hf.endswith(("_scale", "layer_scalar")) or (".experts." in hf and
                                                       not hf.endswith(".weight")):
            hf = hf + ".weight"  # Gemma3NModel / Gemma4Model.filter_tensors
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf
        out.append((name, a))
    for base, per in stacks.items():
        name = names.get_name(base, try_suffixes=(".weight",))
        assert name is not None, base
        out.append((name + ".weight", np.stack([per[j] for j in sorted(per)])))
    if arch == "gemma4":  # Gemma4Model.generate_extra_tensors: proportional RoPE's factors
        full = cfg.rope_parameters["full_attention"]
        hd = _full_layer(cfg).head_dim
        n_rot = int(hd * full["partial_rotary_factor"] / 2)
        out.append(("rope_freqs.weight", np.asarray([1.0] * n_rot + [1e30] * (hd // 2 - n_rot),
                                                    np.float32)))
    return out


def write_gguf(t: Any, arch: str, out: Path, extra: dict[str, np.ndarray] | None = None) -> Path:
    from safetensors.torch import load_file

    cfg = _Attrs(t.config)
    w = gguf.GGUFWriter(str(out), arch)
    for key, (value, vtype) in _metadata(t.config, arch).items():
        if vtype == "ARRAY":
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, gguf.GGUFValueType[vtype])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(gpt2_byte_tokens(cfg.vocab_size))
    w.add_token_types([1] * cfg.vocab_size)
    for name, a in _tensors(load_file(str(t.path / "model.safetensors")), cfg, arch):
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    for name, a in (extra or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    import tests.support.tiny_families_gemma as tg

    made: dict[str, tuple[Any, Path]] = {}
    root = tmp_path_factory.mktemp("gguf_gemma")

    def get(name: str) -> tuple[Any, Path]:
        if name not in made:
            arch, mt, over = CASES[name]
            tg.GEMMA_FAMILIES.setdefault(f"gguf_{name}", (mt, over))
            t = make_gemma(root, f"gguf_{name}")
            made[name] = (t, write_gguf(t, arch, root / f"{name}.gguf"))
        return made[name]

    return get


@pytest.mark.parametrize("name", ["gemma3n", "gemma4", "gemma4_moe"])
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


def test_gguf_gemma4_axes_come_back_from_the_metadata(case):
    """The per-layer geometry, keys as values, the rotated fraction (from rope_freqs) and the
    double-wide MLP are read back as the HF config has them."""
    from mi_transformer.gguf import read_gguf

    _, path = case("gemma4_moe")
    cfg = read_gguf(path).config
    assert (cfg["global_head_dim"], cfg["head_dim"]) == (24, 16)
    assert cfg["attention_k_eq_v"] and cfg["num_global_key_value_heads"] == 1
    assert cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"] == 0.5
    assert (cfg["num_experts"], cfg["top_k_experts"], cfg["moe_intermediate_size"]) == (4, 2, 24)
    dense = read_gguf(case("gemma4")[1]).config
    assert dense["use_double_wide_mlp"] and dense["num_kv_shared_layers"] == 2


def test_gguf_gemma3n_padded_per_layer_table_reads_zero_rows_as_llama_cpp(case, make_ids):
    """llama.cpp pads the per-layer table to the vocabulary with zero rows: ids past the
    original table (100 here) read zeros, as llama.cpp computes them, where transformers reads
    row 0 (docs/DEVIATIONS.md). Ids inside the table give transformers' numbers."""
    t, path = case("gemma3n_padded")
    model = mi.MIModel.from_pretrained(path)
    assert model.config.per_layer_input.vocab == 128
    inside = make_ids(2, 12, seed=3) % 97 + 3
    with torch.no_grad():
        ref = t.hf(inside).logits
    assert (model.forward(inside).output - ref).abs().max().item() < TOL
    emb = model.backend.w.per_layer.embed
    assert torch.equal(emb[100:], torch.zeros_like(emb[100:]))


def test_gguf_shared_layers_key_tensors_are_ignored(case, tmp_path, make_ids):
    """A GGUF converted from a published checkpoint keeps k / v tensors for the layers that
    share keys: ignored, the numbers unchanged."""
    t, _ = case("gemma4")
    extra = {"blk.2.attn_k.weight": np.ones((32, 64), np.float32),
             "blk.3.attn_v.weight": np.ones((32, 64), np.float32)}
    path = write_gguf(t, "gemma4", tmp_path / "with_kv.gguf", extra)
    ids = make_ids(1, 10, seed=4)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (mi.MIModel.from_pretrained(path).forward(ids).output - ref).abs().max().item() < TOL


def test_gguf_gemma_bad_metadata_and_tensors_are_typed_errors(case, tmp_path):
    t, _ = case("gemma4")
    bad = write_gguf(t, "gemma4", tmp_path / "odd.gguf",
                     {"blk.0.mystery.weight": np.ones(3, np.float32)})
    with pytest.raises(mi.UnsupportedModelError, match="mystery"):
        mi.MIModel.from_pretrained(bad)
    from mi_transformer.gguf import read_gguf
    from mi_transformer.gguf.arches_gemma import _gemma4_config
    from mi_transformer.gguf.arches import _Meta
    from mi_transformer.gguf.header import read_gguf_header

    header = read_gguf_header(case("gemma4")[1])
    header.metadata["gemma4.attention.sliding_window_pattern"] = [True]
    with pytest.raises(mi.ConfigError, match="sliding_window_pattern"):
        _gemma4_config(_Meta(header, "gemma4"), header)
    assert read_gguf(case("gemma4")[1]).config["model_type"] == "gemma4_text"


@pytest.mark.parametrize("key, value", [("block_count", 10**9), ("embedding_length", 2**40),
                                        ("feed_forward_length", [2**40] * 4)])
def test_gguf_gemma_absurd_sizes_are_refused_before_allocating(case, key, value):
    from mi_transformer.config.size import ConfigTooLarge
    from mi_transformer.gguf.arches_gemma import read_gemma_gguf
    from mi_transformer.gguf.header import read_gguf_header

    header = read_gguf_header(case("gemma3n")[1])
    header.metadata[f"gemma3n.{key}"] = value
    with pytest.raises(ConfigTooLarge):
        read_gemma_gguf(header, torch.float32)
