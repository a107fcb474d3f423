"""GGUF files of the hybrid families: llama.cpp's ``granitehybrid`` (Granite 4.0-H with and
without experts, Bamba), ``nemotron_h``, ``qwen3next``, ``qwen35`` and ``qwen35moe``.

Each tiny checkpoint (tests/support/hybrid_tiny.py, linear_tiny.py: unit scale, the settings
released ones use: grouped heads, Mamba-2 groups, more value than key heads in the gated
DeltaNet, partial rotary, experts with a shared expert) is written as llama.cpp's converter
writes it by tests/support/gguf_convert_hybrid.py (the converter functions and commits it
follows are named there; written without mi_transformer.gguf). Reference: transformers on the
source checkpoint; F32 logits max abs diff < 1e-4. Every tensor comes back bit-identical but
A_log (log(-(-exp(A_log))) in float32, to 1e-6) and the (1 + w) norms of the Qwen hybrids
((w + 1) - 1 in float32, to 1e-7).

The Granite 4.0-H cases have no RoPE (position_embedding_type "nope", as released): the
converter writes every Granite 4.0-H with Mamba layers without it (see
test_a_granite_saved_with_rope_is_converted_without_it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, UnsupportedModelError, WeightLoadError
from mi_transformer.gguf import read_gguf
from tests.support import gguf_convert as conv
from tests.support import gguf_convert_hybrid as ch
from tests.support.family_checks import assert_greedy_tokens_equal_transformers
from tests.support.hybrid_tiny import make_tiny_hybrid
from tests.support.linear_tiny import _COMMON, make_tiny_linear
from tests.support.ssm_tiny import ssm_ids
from tests.transformer.test_transformer_gguf_new_arches import _rewrite

gguf = pytest.importorskip("gguf")
pytest.importorskip("mi_ssm")
TOL = 1e-4

#: name -> (GGUF arch, model_type, how the tiny checkpoint is made)
CASES: dict[str, tuple[str, str, str]] = {
    "bamba": ("granitehybrid", "bamba", "hybrid"),
    "granitemoehybrid": ("granitehybrid", "granitemoehybrid", "hybrid"),
    "granitemoehybrid_dense": ("granitehybrid", "granitemoehybrid", "hybrid"),
    "nemotron_h": ("nemotron_h", "nemotron_h", "hybrid"),
    "qwen3_next": ("qwen3next", "qwen3_next", "linear"),
    "qwen3_5_text": ("qwen35", "qwen3_5_text", "linear"),
}
#: the released Granite 4.0-H have no positions
_NOPE = {"granitemoehybrid": {"position_embedding_type": "nope"}}


def _convert(t: Any, name: str, arch: str, out: Path, hp: dict | None = None,
             **kw: Any) -> Path:
    from safetensors.torch import load_file

    sd = load_file(str(t.path / "model.safetensors"))
    hp = dict(hp or t.hf.config.to_dict())
    if arch == "granitehybrid":
        hp = ch.granite_hparams(hp)
        return conv.write(out, arch, t.hf.config, sd, hp=hp, params=ch.granitehybrid_params,
                          modify=ch.granitehybrid_modify(hp), **kw)
    if arch == "nemotron_h":
        hp = ch.nemotron_h_hparams(hp)
        return conv.write(out, arch, t.hf.config, sd, hp=hp, params=ch.nemotron_h_params,
                          modify=ch.nemotron_h_modify(hp), **kw)
    params, modify = (ch.qwen3next_params, ch.qwen3next_modify) if arch == "qwen3next" else \
        (ch.qwen35_params, ch.qwen35_modify)
    return conv.write(out, arch, t.hf.config, sd, hp=hp, params=params, modify=modify, **kw)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    made: dict[str, tuple[Any, Path]] = {}
    root = tmp_path_factory.mktemp("gguf_hybrid")

    def get(name: str) -> tuple[Any, Path]:
        if name not in made:
            arch, _, kind = CASES[name]
            t = make_tiny_hybrid(root, name, **_NOPE.get(name, {})) if kind == "hybrid" \
                else make_tiny_linear(root, name)
            made[name] = (t, _convert(t, name, arch, root / f"{name}.gguf"))
        return made[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_logits_equal_transformers_on_the_source_checkpoint(case, name):
    t, path = case(name)
    model = mi.MIModel.from_pretrained(path)
    assert model.config.model_type == CASES[name][1]
    ids = ssm_ids(2, 20, seed=9)
    with torch.no_grad():
        ref = t.hf(ids).logits
    got = model.forward(ids).output
    assert (got - ref).abs().max().item() < TOL
    assert got.std().item() > 0.1


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_tensors_are_the_source_tensors(case, name):
    """Joined experts and MLP halves, the q / k rows unpermuted, Qwen3-Next's in_proj_qkvz
    rebuilt, Qwen3.5's value heads back in grouped order: equal; A_log and the (1 + w) norms
    to float32 rounding."""
    from safetensors.torch import load_file

    t, path = case(name)
    ckpt = read_gguf(path)
    saved = load_file(str(t.path / "model.safetensors"))
    assert set(ckpt.tensors) == set(saved)
    offset = CASES[name][0] in ("qwen3next", "qwen35")
    for k, v in saved.items():
        if k.endswith("A_log"):
            torch.testing.assert_close(ckpt.tensors[k], v, rtol=1e-6, atol=1e-6)
        elif offset and k.endswith("norm.weight") and "linear_attn.norm" not in k:
            torch.testing.assert_close(ckpt.tensors[k], v, rtol=0, atol=1e-7)
        else:
            assert torch.equal(ckpt.tensors[k], v), k


@pytest.mark.parametrize("name, keys", [
    ("bamba", ("attn_layer_indices", "mamba_n_heads", "mamba_d_head", "mamba_n_groups",
               "mamba_d_state", "mamba_expand", "intermediate_size", "num_key_value_heads")),
    ("granitemoehybrid", ("num_local_experts", "num_experts_per_tok", "shared_intermediate_size",
                          "embedding_multiplier", "residual_multiplier", "attention_multiplier",
                          "logits_scaling", "position_embedding_type", "mamba_n_groups")),
    ("granitemoehybrid_dense", ("num_local_experts", "shared_intermediate_size",
                                "residual_multiplier")),
    ("nemotron_h", ("head_dim", "mamba_num_heads", "mamba_head_dim", "n_groups",
                    "ssm_state_size", "intermediate_size", "num_key_value_heads")),
    ("qwen3_next", ("layer_types", "linear_num_key_heads", "linear_num_value_heads",
                    "linear_key_head_dim", "linear_value_head_dim", "num_experts",
                    "moe_intermediate_size", "shared_expert_intermediate_size", "head_dim")),
    ("qwen3_5_text", ("layer_types", "linear_num_value_heads", "intermediate_size")),
])
def test_gguf_metadata_gives_the_source_config(case, name, keys):
    t, path = case(name)
    cfg = read_gguf(path).config
    src = t.hf.config.to_dict()
    if name == "granitemoehybrid":  # the hub's spelling, as the converter reads it
        src["layer_types"] = ch.granite_hparams(src)["layer_types"]
    # float metadata is float32 in the file
    assert {k: pytest.approx(cfg[k], rel=1e-6) if isinstance(cfg[k], float) else cfg[k]
            for k in keys} == {k: src[k] for k in keys}


def test_nemotron_h_layer_kinds_come_back_from_per_layer_metadata(case):
    t, path = case("nemotron_h")
    assert read_gguf(path).config["hybrid_override_pattern"] == "M-*M"
    model = mi.MIModel.from_pretrained(path)
    assert model.layer_types == ["mamba2", "mlp", "full_attention", "mamba2"]


def test_granite_rotary_fraction_and_rope_switch(case):
    _, bamba = case("bamba")
    cfg = read_gguf(bamba).config
    assert cfg["model_type"] == "bamba" and "rope_theta" in cfg
    _, granite = case("granitemoehybrid")
    assert read_gguf(granite).config["position_embedding_type"] == "nope"


def test_a_granite_saved_with_rope_is_converted_without_it(tmp_path):
    """``GraniteHybridModel`` sets ``rope.scaling.finetuned`` only for Bamba (or a Granite
    without Mamba layers): a Granite 4.0-H saved with position_embedding_type "rope" becomes
    a GGUF without positions, which llama.cpp and mi-core run so. With the switch set in the
    file (llama.cpp's meaning of it), RoPE is back and the numbers are transformers'."""
    t = make_tiny_hybrid(tmp_path, "granitemoehybrid")  # position_embedding_type "rope"
    path = _convert(t, "granitemoehybrid", "granitehybrid", tmp_path / "rope.gguf")
    assert read_gguf(path).config["position_embedding_type"] == "nope"
    on = _rewrite(path, tmp_path / "on.gguf",
                  meta={"granitehybrid.rope.scaling.finetuned": (True, "BOOL")})
    assert read_gguf(on).config["position_embedding_type"] == "rope"
    ids = ssm_ids(2, 16, seed=3)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (mi.MIModel.from_pretrained(on).forward(ids).output - ref).abs().max() < TOL


def test_a_missing_attention_scale_is_llama_cpps_inverse_sqrt_head_dim(case, tmp_path):
    _, path = case("granitemoehybrid")
    bad = _rewrite(path, tmp_path / "scale.gguf",
                   meta={"granitehybrid.attention.scale": (None, "")})
    assert read_gguf(bad).config["attention_multiplier"] == pytest.approx(8 ** -0.5)


@pytest.mark.parametrize("name", ["granitemoehybrid", "qwen3_5_text"])
def test_cached_generation_from_the_gguf_equals_transformers(case, name):
    t, path = case(name)
    model = mi.MIModel.from_pretrained(path)
    assert_greedy_tokens_equal_transformers(t.hf, model, ssm_ids(1, 6, seed=4))


def test_qwen3next_gguf_with_in_proj_qkvz_whole_as_older_converters_wrote_it(case, tmp_path):
    """Older converters wrote in_proj_qkvz unchanged as ``ssm_in`` (llama.cpp's legacy
    path); the split attn_qkv / attn_gate of newer files are its rows regrouped."""
    t, path = case("qwen3_next")
    r = gguf.GGUFReader(str(path))
    drop = tuple(x.name for x in r.tensors if x.name.endswith(("attn_qkv.weight",
                                                              "attn_gate.weight")))
    whole = {f"blk.{i}.ssm_in.weight": layer.linear_attn.in_proj_qkvz.weight.detach().numpy()
             for i, layer in enumerate(t.hf.model.layers) if hasattr(layer, "linear_attn")}
    old = _rewrite(path, tmp_path / "ssm_in.gguf", drop=drop, add=whole)
    ids = ssm_ids(2, 12, seed=5)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (mi.MIModel.from_pretrained(old).forward(ids).output - ref).abs().max() < TOL


def test_the_mtp_layer_of_a_qwen35_gguf_is_not_loaded(case, tmp_path):
    """Qwen3.5's multi-token-prediction block is appended by the converter as one more layer
    (``nextn_predict_layers``): left out, like transformers leaves out ``mtp.*``."""
    t, _ = case("qwen3_5_text")
    n, d = t.hf.config.num_hidden_layers, t.hf.config.hidden_size
    hp = dict(t.hf.config.to_dict(), mtp_num_hidden_layers=1)
    g = np.random.default_rng(0)
    extra = {f"blk.{n}.attn_norm.weight": g.standard_normal(d),
             f"blk.{n}.attn_q.weight": g.standard_normal((2 * d, d)),
             f"blk.{n}.nextn.eh_proj.weight": g.standard_normal((d, 2 * d))}
    path = _convert(t, "qwen3_5_text", "qwen35", tmp_path / "mtp.gguf", hp=hp,
                    block_count=n + 1, extra=extra)
    cfg = read_gguf(path).config
    assert cfg["num_hidden_layers"] == n
    ids = ssm_ids(1, 10, seed=6)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (mi.MIModel.from_pretrained(path).forward(ids).output - ref).abs().max() < TOL


# ----------------------------------------------------------------------------- Qwen3.5-MoE

@pytest.fixture(scope="module")
def qwen35moe(tmp_path_factory):
    """A tiny Qwen3.5-MoE (text) and its GGUF (``Qwen3_5MoeTextModel``)."""
    from tests.support.linear_tiny import _randomise
    from transformers import AutoConfig, AutoModelForCausalLM

    root = tmp_path_factory.mktemp("gguf_qwen35moe")
    cfg = AutoConfig.for_model("qwen3_5_moe_text", **{
        k: v for k, v in _COMMON.items() if k != "intermediate_size"},
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=24)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _randomise(hf, 0, zero_centred=True)
    hf.save_pretrained(root / "src")

    class T:
        pass

    t = T()
    t.hf, t.path = hf, root / "src"  # type: ignore[attr-defined]
    return t, _convert(t, "qwen3_5_moe", "qwen35moe", root / "qwen35moe.gguf")


def test_qwen35moe_metadata_gives_transformers_config(qwen35moe):
    """The config from the GGUF is transformers' Qwen3_5MoeTextConfig of the source."""
    from mi_transformer.gguf import hf_config, read_gguf_header

    t, path = qwen35moe
    cfg = hf_config(read_gguf_header(path))
    src = t.hf.config.to_dict()
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "layer_types", "linear_conv_kernel_dim",
            "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
            "linear_num_value_heads", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "shared_expert_intermediate_size", "vocab_size",
            "tie_word_embeddings", "rope_parameters")
    assert {k: cfg[k] for k in keys} == {k: src[k] for k in keys}


def test_qwen35moe_loads_where_its_family_is_installed(qwen35moe):
    """Parity once ``qwen3_5_moe_text`` is a family (added beside this on another branch);
    until then a typed refusal naming the model_type."""
    from mi_transformer.config import FAMILIES

    t, path = qwen35moe
    if "qwen3_5_moe_text" not in FAMILIES:
        with pytest.raises(UnsupportedModelError, match="model_type 'qwen3_5_moe_text'"):
            read_gguf(path)
        return
    ids = ssm_ids(2, 16, seed=8)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (mi.MIModel.from_pretrained(path).forward(ids).output - ref).abs().max() < TOL


# ------------------------------------------------------------------------- malformed files

def test_an_attention_schedule_that_is_not_the_tensors_is_a_config_error(case, tmp_path):
    _, path = case("qwen3_next")
    bad = _rewrite(path, tmp_path / "every2.gguf",
                   meta={"qwen3next.full_attention_interval": (2, "UINT32")})
    with pytest.raises(ConfigError, match=r"attention layers .*\[1, 3\].*\[3\]"):
        read_gguf(bad)


@pytest.mark.parametrize("name, key, value", [
    ("granitemoehybrid", "granitehybrid.attention.head_count_kv", ([2, 1, 0], "ARRAY")),
    ("nemotron_h", "nemotron_h.feed_forward_length", ([0, 48, 48], "ARRAY")),
    ("qwen3_5_text", "qwen35.rope.dimension_sections", ("abc", "STRING")),
])
def test_malformed_per_layer_metadata_is_a_config_error_naming_it(case, tmp_path, name, key,
                                                                  value):
    _, path = case(name)
    bad = _rewrite(path, tmp_path / "meta.gguf", meta={key: value})
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        read_gguf(bad)


@pytest.mark.parametrize("name, key", [
    ("bamba", "granitehybrid.ssm.time_step_rank"),
    ("nemotron_h", "nemotron_h.ssm.inner_size"),
    ("qwen3_next", "qwen3next.ssm.group_count"),
    ("qwen3_5_text", "qwen35.ssm.state_size"),
])
def test_a_missing_ssm_key_is_a_config_error_naming_it(case, tmp_path, name, key):
    _, path = case(name)
    bad = _rewrite(path, tmp_path / "nokey.gguf", meta={key: (None, "")})
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        read_gguf(bad)


def test_a_mis_shaped_half_of_the_split_qkvz_is_named(case, tmp_path):
    _, path = case("qwen3_next")
    bad = _rewrite(path, tmp_path / "gate.gguf",
                   tensors={"blk.1.attn_gate.weight": np.zeros((16, 32), np.float32)})
    with pytest.raises(WeightLoadError, match=r"blk\.1\.attn_gate\.weight \[16, 32\]"):
        read_gguf(bad)


def test_a_missing_half_of_the_granite_experts_is_named(case, tmp_path):
    _, path = case("granitemoehybrid")
    bad = _rewrite(path, tmp_path / "noup.gguf", drop=("blk.2.ffn_up_exps.weight",))
    with pytest.raises(WeightLoadError, match=r"missing tensors: blk\.2\.ffn_up_exps\.weight"):
        read_gguf(bad)


def test_a_positive_ssm_a_is_a_weight_load_error_naming_it(case, tmp_path):
    _, path = case("nemotron_h")
    r = gguf.GGUFReader(str(path))
    a = next(np.array(x.data) for x in r.tensors if x.name == "blk.3.ssm_a")
    bad = _rewrite(path, tmp_path / "a.gguf", tensors={"blk.3.ssm_a": np.abs(a)})
    with pytest.raises(WeightLoadError, match=r"blk\.3\.ssm_a.*negative"):
        read_gguf(bad)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["granitemoehybrid", "bamba", "nemotron_h", "qwen3_next",
                                  "qwen3_5_text"])
def test_fuzzed_metadata_values_fail_only_with_mi_errors(case, tmp_path_factory, name):
    """Any value of any GGUF type at any of the architecture's keys either loads or raises an
    MIError."""
    from tests.support.gguf_fuzz import fuzz_metadata

    _, good = case(name)
    arch = CASES[name][0]
    keys = [k for k in read_gguf(good).metadata if k.startswith(f"{arch}.")]
    fuzz_metadata(keys, lambda path, meta: _rewrite(good, path, meta=meta), read_gguf,
                  tmp_path_factory.mktemp("fuzz_hybrid"))
