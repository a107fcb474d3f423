"""GGUF files of the architectures issue 21 adds last: ``glm4``, ``glm4moe``, ``ernie4_5-moe``,
``hunyuan-dense``, ``apertus``, ``gpt-oss`` (F32 and MXFP4 experts), ``deepseek2`` (V2 with
and without a q latent, V3), ``llama4``, and OLMo's ``olmo`` and ``smollm3``.

Each tiny checkpoint is written as llama.cpp's converter writes it by
tests/support/gguf_convert.py (the converter functions and commits it follows are named
there; written without mi_transformer.gguf, whose inverse mapping is what is tested): MLA's
kv_b split into k_b / v_b, gpt-oss's gate_up de-interleaved and its MXFP4 blocks repacked,
Llama 4's experts transposed and split, experts stacked, Apertus' xIELU parameters as
metadata, GLM-4.5's multi-token-prediction layer appended. The configs use what llama.cpp can
express (what its runtime has built in, named in mi_transformer/gguf/arches_moe2.py, and
yarn with ``mscale`` = ``mscale_all_dim``). Reference: transformers on the source checkpoint
(for MXFP4: on the experts transformers' ``convert_moe_packed_tensors`` dequantises from the
same blocks). F32 logits: max abs diff < 1e-4; every F32 tensor back bit-identical.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, UnsupportedModelError, WeightLoadError
from mi_transformer.gguf import read_gguf
from tests.support import gguf_convert as conv
from tests.support.tiny_families import FAMILIES
from tests.support.tiny_families_moe2 import MOE2_FAMILIES
from tests.transformer.conftest import make_tiny

gguf = pytest.importorskip("gguf")
TOL = 1e-4

_SCOUT_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
               "low_freq_factor": 1.0, "high_freq_factor": 1.0,
               "original_max_position_embeddings": 8192}
_APERTUS_ROPE = {"rope_type": "llama3", "rope_theta": 12_000_000.0, "factor": 8.0,
                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}


def _ds(name: str, mscale: float, **extra: Any) -> dict[str, Any]:
    """A DeepSeek tiny family whose yarn has mscale = mscale_all_dim (llama.cpp writes one)."""
    over = dict(MOE2_FAMILIES[name][1], **extra)
    rope = over.get("rope_parameters")
    if rope is not None:
        over["rope_parameters"] = dict(rope, mscale=mscale, mscale_all_dim=mscale)
    return over


_GPT_OSS = {k: v for k, v in MOE2_FAMILIES["gpt_oss"][1].items()
            if k not in ("swiglu_limit", "swiglu_alpha")}  # llama.cpp's are built in

#: name -> (GGUF arch, model_type, config overrides on tiny_families._COMMON)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "glm4": ("glm4", "glm4", FAMILIES["glm4"][1]),
    "glm4_moe": ("glm4moe", "glm4_moe", FAMILIES["glm4_moe"][1]),
    "ernie4_5_moe": ("ernie4_5-moe", "ernie4_5_moe", FAMILIES["ernie4_5_moe"][1]),
    # the converter asserts this NTK-alpha base (10000) and a 32k context
    "hunyuan_dense": ("hunyuan-dense", "hunyuan_v1_dense", {
        "head_dim": 16, "max_position_embeddings": 32768, "rope_parameters": {
            "rope_type": "dynamic", "alpha": 50.0, "rope_theta": 10000.0, "factor": 1.0}}),
    # Apertus' published RoPE (llama3 over 8192 tokens, the converter's fixed length)
    "apertus": ("apertus", "apertus", {"head_dim": 16, "rope_parameters": _APERTUS_ROPE}),
    "gpt_oss": ("gpt-oss", "gpt_oss", _GPT_OSS),
    "gpt_oss_mxfp4": ("gpt-oss", "gpt_oss", _GPT_OSS),
    "deepseek_v2": ("deepseek2", "deepseek_v2", _ds("deepseek_v2", 0.707)),
    "deepseek_v2_lite": ("deepseek2", "deepseek_v2", _ds("deepseek_v2_lite", 0.707)),
    # published V3 configs carry scoring_func (the converter writes the gating from it)
    "deepseek_v3": ("deepseek2", "deepseek_v3", _ds("deepseek_v3", 1.0,
                                                    scoring_func="sigmoid")),
    # Scout-like: llama.cpp's fixed chunk (8192), NoPE every fourth layer, temperature
    # tuning (floor 8192, scale 0.1), q/k norms; MoE every second layer
    "llama4": ("llama4", "llama4_text", dict(
        intermediate_size=32, intermediate_size_mlp=96, head_dim=16, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=2, num_hidden_layers=4,
        rope_parameters=_SCOUT_ROPE)),
    # OLMo: weightless LayerNorms, a clamp that clips; SmolLM3: llama.cpp's NoPE every
    # fourth layer (its only schedule), no sliding window
    "olmo": ("olmo", "olmo", FAMILIES["olmo"][1]),
    "smollm3": ("smollm3", "smollm3", {"num_hidden_layers": 4, "rope_theta": 700.0,
                                       "attention_bias": True}),
    # every layer full attention with RoPE (MobileLLM-style): the converter writes a sliding
    # window of 0, which turns llama.cpp's chunks, NoPE layers and temperature tuning off
    "llama4_full": ("llama4", "llama4_text", dict(
        intermediate_size=32, intermediate_size_mlp=96, head_dim=16, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=2, num_hidden_layers=4,
        layer_types=["full_attention"] * 4, no_rope_layers=[1] * 4,
        attn_temperature_tuning=False)),
}

#: GGUF arch -> (params, modify) of gguf_convert
_CONVERTERS: dict[str, tuple[Callable[..., None] | None, Callable[..., Any] | None]] = {
    "glm4": (conv.glm4_params, None),
    "glm4moe": (conv.glm4_moe_params, None),
    "ernie4_5-moe": (conv.ernie4_5_moe_params, None),
    "hunyuan-dense": (conv.hunyuan_dense_params, conv.skip_tied),
    "gpt-oss": (conv.gpt_oss_params, conv.gpt_oss_modify),
    "deepseek2": (conv.deepseek2_params, conv.deepseek2_modify),
    "llama4": (conv.llama4_params, conv.llama4_modify),
    "olmo": (conv.olmo_params, conv.olmo_modify),
    "smollm3": (conv.llama_params, conv.llama_modify),
}


def _mxfp4(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random HF MXFP4 blocks [.., groups, 16] and E8M0 scales near 2^0 (unit-scale)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (*shape, 16), generator=g, dtype=torch.uint8),
            torch.randint(123, 127, shape, generator=g, dtype=torch.uint8))


def _with_mxfp4_experts(t: Any) -> dict[str, tuple[np.ndarray, Any]]:
    """gpt-oss as published: MXFP4 experts. The HF model gets transformers' dequantisation of
    the blocks (the reference); returns the converter's repacked GGUF tensors."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    cfg, raw = t.hf.config, {}
    d, f, e = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    for i, layer in enumerate(t.hf.model.layers):
        gu = _mxfp4((e, 2 * f, d // 32), seed=10 + i)
        dn = _mxfp4((e, d, f // 32), seed=20 + i)
        experts = layer.mlp.experts
        with torch.no_grad():
            experts.gate_up_proj.copy_(convert_moe_packed_tensors(*gu, dtype=torch.float32))
            experts.down_proj.copy_(convert_moe_packed_tensors(*dn, dtype=torch.float32))
        raw.update(conv.gpt_oss_mxfp4_experts(i, gu, dn))
    return raw


def _mtp_layer(cfg: Any) -> dict[str, np.ndarray]:
    """A published GLM-4.5's multi-token-prediction layer as the converter writes it (layer
    num_hidden_layers, with its nextn tensors): not part of the causal LM."""
    n, d = cfg.num_hidden_layers, cfg.hidden_size
    g = np.random.default_rng(0)
    return {f"blk.{n}.attn_norm.weight": g.standard_normal(d),
            f"blk.{n}.attn_q.weight": g.standard_normal((d, d)),
            f"blk.{n}.nextn.eh_proj.weight": g.standard_normal((d, 2 * d)),
            f"blk.{n}.nextn.enorm.weight": g.standard_normal(d)}


def write_case(t: Any, arch: str, out: Path, name: str = "") -> Path:
    from safetensors.torch import load_file

    sd = load_file(str(t.path / "model.safetensors"))
    params, modify = _CONVERTERS.get(arch, (None, None))
    kw: dict[str, Any] = {}
    if arch == "apertus":
        modify, params = conv.apertus(t.hf.config.num_hidden_layers)
    freqs = conv.llama3_rope_freqs(*conv.hparams(t.hf.config))  # LlamaModel's, inherited
    if arch in ("apertus", "llama4") and freqs is not None:
        kw["extra"] = {"rope_freqs.weight": freqs}
    if arch == "glm4moe":
        kw["block_count"] = t.hf.config.num_hidden_layers + t.hf.config.num_nextn_predict_layers
        kw["extra"] = _mtp_layer(t.hf.config)
    if name == "gpt_oss_mxfp4":
        kw["raw"] = _with_mxfp4_experts(t)
        sd = {k: v for k, v in sd.items() if not k.endswith(("gate_up_proj", "down_proj"))}
    return conv.write(out, arch, t.hf.config, sd, params=params, modify=modify, **kw)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    made: dict[str, tuple[Any, Path]] = {}
    root = tmp_path_factory.mktemp("gguf_new")

    def get(name: str) -> tuple[Any, Path]:
        if name not in made:
            arch, model_type, over = CASES[name]
            t = make_tiny(root, name, model_type, over)
            made[name] = (t, write_case(t, arch, root / f"{name}.gguf", name))
        return made[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_logits_equal_transformers_on_the_source_checkpoint(case, make_ids, name):
    t, path = case(name)
    model = mi.MIModel.from_pretrained(path)
    assert model.config.model_type == CASES[name][1]
    ids = make_ids(2, 16, seed=47)
    with torch.no_grad():
        ref = t.hf(ids).logits
    got = model.forward(ids).output
    assert (got - ref).abs().max().item() < TOL
    assert got.std().item() > 0.1


@pytest.mark.parametrize("name", ["glm4_moe", "ernie4_5_moe", "apertus", "gpt_oss",
                                  "deepseek_v2", "deepseek_v2_lite", "deepseek_v3", "llama4",
                                  "olmo", "smollm3"])
def test_gguf_tensors_are_the_source_tensors(case, name):
    """F32 round trip: every tensor back bit-identical under its HF name (kv_b joined again,
    experts restacked, xIELU parameters from the metadata, the MTP layer left out)."""
    t, path = case(name)
    ckpt = read_gguf(path)
    ref = {k: v.detach() for k, v in t.hf.state_dict().items()}
    if t.hf.config.tie_word_embeddings:
        ref.pop("lm_head.weight", None)
    from mi_transformer.weights import expected_shapes
    from mi_transformer.config import parse_config

    want = set(expected_shapes(parse_config(ckpt.config)))
    assert set(ckpt.tensors) == want
    from safetensors.torch import load_file

    saved = load_file(str(t.path / "model.safetensors"))
    for k in want:
        assert torch.equal(ckpt.tensors[k], saved[k].float()), k


def test_mxfp4_experts_are_transformers_dequantisation_of_the_same_blocks(case):
    t, path = case("gpt_oss_mxfp4")
    ckpt = read_gguf(path)
    for i, layer in enumerate(t.hf.model.layers):
        p = f"model.layers.{i}.mlp.experts."
        assert torch.equal(ckpt.tensors[p + "gate_up_proj"], layer.mlp.experts.gate_up_proj)
        assert torch.equal(ckpt.tensors[p + "down_proj"], layer.mlp.experts.down_proj)
        assert ckpt.quant_types[p + "down_proj"] == "MXFP4"


@pytest.mark.parametrize("name, want", [
    ("glm4", {"partial_rotary_factor": 0.75, "attention_bias": True}),
    ("glm4_moe", {"num_hidden_layers": 3, "num_nextn_predict_layers": 1, "n_group": 2,
                  "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
                  "first_k_dense_replace": 1, "use_qk_norm": True}),
    ("ernie4_5_moe", {"moe_layer_start_index": 1, "moe_layer_interval": 1,
                      "moe_num_shared_experts": 1}),
    ("gpt_oss", {"layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                 "sliding_window": 5}),
    ("deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                     "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                     "v_head_dim": 12, "attention_bias": True}),
    ("deepseek_v2_lite", {"topk_method": "greedy", "q_lora_rank": None}),
    ("deepseek_v3", {"model_type": "deepseek_v3", "norm_topk_prob": True}),
    ("llama4", {"attention_chunk_size": 8192, "no_rope_layer_interval": 4,
                "interleave_moe_layer_step": 2, "use_qk_norm": True,
                "intermediate_size_mlp": 96, "intermediate_size": 32}),
])
def test_gguf_metadata_gives_the_source_config(case, name, want):
    _, path = case(name)
    cfg = read_gguf(path).config
    assert {k: cfg.get(k) for k in want} == want


@pytest.mark.parametrize("name, keys", [
    ("apertus", ("rope_type", "factor", "low_freq_factor", "high_freq_factor",
                 "original_max_position_embeddings")),
    ("llama4", ("rope_type", "factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")),
    ("deepseek_v3", ("rope_type", "factor", "original_max_position_embeddings", "mscale",
                     "mscale_all_dim", "beta_fast", "beta_slow")),
    ("gpt_oss", ("rope_type", "factor", "original_max_position_embeddings", "beta_fast",
                 "beta_slow", "truncate")),
])
def test_rope_scaling_comes_back_from_the_gguf(case, name, keys):
    t, path = case(name)
    got = read_gguf(path).config["rope_scaling"]
    src = t.hf.config.rope_parameters
    assert {k: pytest.approx(got[k]) for k in keys} == {k: src[k] for k in keys}


def test_llama4_sliding_window_zero_is_full_attention_everywhere(case):
    _, path = case("llama4_full")
    model = mi.MIModel.from_pretrained(path)
    assert model.backend.config.layer_chunks == (None,) * 4
    assert model.backend.config.layer_use_rope == (True,) * 4


@pytest.mark.xfail(raises=TypeError, strict=True, reason="transformers 5.24's GGUF loader "
                   "cannot read llama.cpp's gpt-oss rope metadata (and expects other expert "
                   "names): when it can, this compares with it")
def test_gpt_oss_gguf_equals_transformers_gguf_loader(case, make_ids):
    from transformers import AutoModelForCausalLM

    t, path = case("gpt_oss")
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval()
    ids = make_ids(1, 12, seed=3)
    with torch.no_grad():
        ref = hf(ids).logits
    assert (mi.MIModel.from_pretrained(path).forward(ids).output - ref).abs().max() < TOL


def test_deepseek_gguf_with_one_kv_b_as_older_converters_wrote_it(case, tmp_path, make_ids):
    """Before llama.cpp split kv_b (MLA absorption) its converter wrote ``attn_kv_b`` as
    stored and the per-head sizes as key_length / value_length, without the *_mla keys."""
    t, path = case("deepseek_v2_lite")
    c = t.hf.config
    r = gguf.GGUFReader(str(path))
    kv_b = {f"blk.{i}.attn_kv_b.weight":
            layer.self_attn.kv_b_proj.weight.detach().numpy() for i, layer in
            enumerate(t.hf.model.layers)}
    drop = tuple(x.name for x in r.tensors if ".attn_k_b." in x.name or ".attn_v_b." in x.name)
    old = _rewrite(path, tmp_path / "old.gguf", drop=drop, add=kv_b, meta={
        "deepseek2.attention.key_length_mla": (None, ""),
        "deepseek2.attention.value_length_mla": (None, ""),
        "deepseek2.attention.key_length": (c.qk_nope_head_dim + c.qk_rope_head_dim, "UINT32"),
        "deepseek2.attention.value_length": (c.v_head_dim, "UINT32")})
    ids = make_ids(2, 12, seed=5)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (mi.MIModel.from_pretrained(old).forward(ids).output - ref).abs().max() < TOL


def test_hunyuan_ntk_alpha_base_is_the_scaled_rope_base(case):
    _, path = case("hunyuan_dense")
    cfg = read_gguf(path).config
    assert "rope_scaling" not in cfg
    assert cfg["rope_theta"] == pytest.approx(10000.0 * 50.0 ** (16 / 14), rel=1e-6)


# ------------------------------------------------------------------------- malformed files

def _rewrite(src: Path, out: Path, *, drop: tuple[str, ...] = (),
             tensors: dict[str, np.ndarray] | None = None,
             add: dict[str, np.ndarray] | None = None,
             meta: dict[str, Any] | None = None) -> Path:
    """A copy of GGUF `src` with tensors dropped, replaced or added and metadata changed
    (``{key: (None, "")}`` drops the key)."""
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(out), arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if meta and key in meta:
            continue
        vtype = field.types[0]
        sub = field.types[1] if len(field.types) > 1 else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for key, (value, vtype) in (meta or {}).items():
        if value is not None:
            w.add_key_value(key, value, gguf.GGUFValueType[vtype])
    for t in r.tensors:
        if t.name in drop:
            continue
        if tensors and t.name in tensors:
            w.add_tensor(t.name, tensors[t.name])
        else:
            w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed(t.shape.tolist())),
                         raw_dtype=t.tensor_type)
    for name, a in (add or {}).items():
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_a_missing_half_of_the_split_kv_b_is_named(case, tmp_path):
    _, path = case("deepseek_v2_lite")
    bad = _rewrite(path, tmp_path / "no_v_b.gguf", drop=("blk.1.attn_v_b.weight",))
    with pytest.raises(WeightLoadError, match=r"missing tensors: blk\.1\.attn_v_b\.weight"):
        read_gguf(bad)


def test_a_mis_shaped_k_b_is_named(case, tmp_path):
    _, path = case("deepseek_v2_lite")
    bad = _rewrite(path, tmp_path / "k_b.gguf", tensors={
        "blk.0.attn_k_b.weight": np.zeros((4, 8, 16), np.float32)})  # [h, nope, kv_lora]
    with pytest.raises(WeightLoadError, match=r"blk\.0\.attn_k_b\.weight \[4, 8, 16\]"):
        read_gguf(bad)


def test_mis_shaped_stacked_experts_are_named(case, tmp_path):
    _, path = case("llama4")
    bad = _rewrite(path, tmp_path / "exps.gguf", tensors={
        "blk.1.ffn_up_exps.weight": np.zeros((4, 16, 64), np.float32)})
    with pytest.raises(WeightLoadError, match=r"blk\.1\.ffn_up_exps\.weight"):
        read_gguf(bad)


@pytest.mark.parametrize("name, key, error", [
    ("apertus", "xielu.alpha_p", ConfigError),
    ("deepseek_v2", "deepseek2.attention.kv_lora_rank", ConfigError),
    ("gpt_oss", "gpt-oss.attention.sliding_window", ConfigError),
    ("glm4_moe", "glm4moe.expert_feed_forward_length", ConfigError),
])
def test_a_missing_metadata_key_is_a_config_error_naming_it(case, tmp_path, name, key, error):
    _, path = case(name)
    bad = _rewrite(path, tmp_path / "nokey.gguf", meta={key: (None, "")})
    with pytest.raises(error, match=key.replace(".", r"\.")):
        read_gguf(bad)


def test_xielu_arrays_of_the_wrong_length_are_a_config_error(case, tmp_path):
    _, path = case("apertus")
    bad = _rewrite(path, tmp_path / "xielu.gguf", meta={"xielu.beta": ([0.5, 0.5], "ARRAY")})
    with pytest.raises(ConfigError, match=r"xielu\.beta.*3 finite numbers"):
        read_gguf(bad)


def test_a_router_the_family_does_not_have_is_refused(case, tmp_path):
    _, path = case("glm4_moe")
    bad = _rewrite(path, tmp_path / "softmax.gguf",
                   meta={"glm4moe.expert_gating_func": (1, "UINT32")})
    with pytest.raises(UnsupportedModelError, match="expert_gating_func"):
        read_gguf(bad)


def test_an_unknown_quantisation_type_of_an_expert_tensor_is_named(case, tmp_path):
    _, path = case("gpt_oss_mxfp4")
    data = bytearray(path.read_bytes())
    header = gguf.GGUFReader(str(path))
    t = next(t for t in header.tensors if t.name == "blk.2.ffn_down_exps.weight")
    # the tensor table entry: name, n_dims, dims, type id (uint32), offset; patch the type
    name = t.name.encode()
    at = bytes(data).index(name) + len(name)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    type_at = at + 4 + 8 * n_dims
    assert int.from_bytes(data[type_at:type_at + 4], "little") == int(t.tensor_type)
    data[type_at:type_at + 4] = (250).to_bytes(4, "little")
    bad = tmp_path / "qtype.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(WeightLoadError, match=r"blk\.2\.ffn_down_exps\.weight.*250"):
        read_gguf(bad)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deepseek_v3", "gpt_oss", "llama4", "glm4_moe", "apertus"])
def test_fuzzed_metadata_values_fail_only_with_mi_errors(case, tmp_path_factory, name):
    """Any value of any GGUF type at any of the architecture's keys (and Apertus' xIELU
    arrays) either loads or raises an MIError, never a raw error from a converter mapping."""
    from tests.support.gguf_fuzz import fuzz_metadata

    _, good = case(name)
    arch = CASES[name][0]
    keys = [k for k in read_gguf(good).metadata if k.startswith((f"{arch}.", "xielu."))]
    fuzz_metadata(keys, lambda path, meta: _rewrite(good, path, meta=meta), read_gguf,
                  tmp_path_factory.mktemp("fuzz_new"))
