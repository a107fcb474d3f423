"""GGUF files of Falcon-H1 (llama.cpp's ``falcon-h1``), LFM2 (``lfm2``) and LFM2-MoE
(``lfm2moe``).

Each tiny checkpoint (tests/support/hybrid2_tiny.py: unit scale, the settings released ones
use: Falcon-H1's multipliers, d_ssm apart from expand, a head_dim that is not hidden / heads,
grouped heads; the gated norm in 2 groups with out_proj and MLP biases; LFM2's schedule with
q/k norms and its adjusted MLP width, tied and untied, with and without conv biases;
LFM2-MoE's dense first layer, sigmoid router and expert bias) is written as llama.cpp's
converter writes it by tests/support/gguf_convert_hybrid2.py (the converter functions and
commits it follows are named there; written without mi_transformer.gguf). Reference:
transformers on the source checkpoint; F32 logits and every layer's residual stream max abs
diff < 1e-4.

Every tensor comes back bit-identical to what the converter wrote from the source: LFM2's
tensors are the source's; Falcon-H1's are the source's times the multipliers the converter
folds into them (the same float32 products); A_log is log(-(-exp(A_log))) in float32 (to
1e-6). Where the file cannot carry the source's numbers the tests pin what happens: Falcon-H1
with a tied head or q/k/v / in_proj biases is refused; LFM2-MoE's routed_scaling_factor is
not written (1.0, the released value, unless ``expert_weights_scale`` says otherwise). The
Falcon-H1 GGUF variant of ``falcon_h1_norm`` puts the norm after the gate and has no
attention biases (the file cannot say otherwise: see arches_hybrid2's docstring); LFM2-MoE's
uses routed_scaling_factor 1.0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, UnsupportedModelError, WeightLoadError
from mi_transformer.gguf import read_gguf
from tests.support import gguf_convert as conv
from tests.support import gguf_convert_hybrid2 as c2
from tests.support.family_checks import assert_greedy_tokens_equal_transformers
from tests.support.hybrid2_tiny import HYBRID2_LAYER_TYPES, make_tiny_hybrid2
from tests.support.ssm_tiny import ssm_ids
from tests.transformer.test_transformer_gguf_new_arches import _rewrite

gguf = pytest.importorskip("gguf")
pytest.importorskip("mi_ssm")
TOL = 1e-4

#: name -> (GGUF arch, tiny recipe, overrides the GGUF can express)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "falcon_h1": ("falcon-h1", "falcon_h1", {}),
    "falcon_h1_norm": ("falcon-h1", "falcon_h1_norm", {
        "mamba_norm_before_gate": False, "attention_bias": False, "mlp_bias": True}),
    "lfm2": ("lfm2", "lfm2", {}),
    "lfm2_bias": ("lfm2", "lfm2_bias", {}),
    "lfm2_moe": ("lfm2moe", "lfm2_moe", {"routed_scaling_factor": 1.0}),
}


def _convert(t: Any, arch: str, out: Path, **kw: Any) -> Path:
    from safetensors.torch import load_file

    sd = load_file(str(t.path / "model.safetensors"))
    hp = t.hf.config.to_dict()
    if arch == "falcon-h1":
        hp = c2.falcon_h1_hparams(hp)
        return conv.write(out, arch, t.hf.config, sd, hp=hp, generic=False,
                          params=c2.falcon_h1_params, modify=c2.falcon_h1_modify(hp), **kw)
    hp = c2.lfm2_hparams(hp)
    params = c2.lfm2_params if arch == "lfm2" else c2.lfm2moe_params
    return conv.write(out, arch, t.hf.config, sd, hp=hp, params=params, modify=c2.lfm2_modify,
                      **kw)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    made: dict[str, tuple[Any, Path]] = {}
    root = tmp_path_factory.mktemp("gguf_hybrid2")

    def get(name: str) -> tuple[Any, Path]:
        if name not in made:
            arch, tiny, over = CASES[name]
            t = make_tiny_hybrid2(root, tiny, **over)
            made[name] = (t, _convert(t, arch, root / f"{name}.gguf"))
        return made[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_logits_and_residual_stream_equal_transformers_on_the_source(case, name):
    t, path = case(name)
    model = mi.MIModel.from_pretrained(path)
    assert model.layer_types == HYBRID2_LAYER_TYPES[CASES[name][1]]
    ids = ssm_ids(2, 20, seed=9)
    with torch.no_grad():
        ref = t.hf(ids, output_hidden_states=True)
    n = model.num_layers
    cache = model.forward(ids, mi.HookSpec().capture_all(mi.HookPoint.resid_pre(i)
                                                         for i in range(n)))
    assert (cache.output - ref.logits).abs().max().item() < TOL
    for i in range(n):  # hidden_states[i] is layer i's input
        assert (cache[mi.HookPoint.resid_pre(i)] - ref.hidden_states[i]).abs().max() < TOL, i
    assert cache.output.std().item() > 0.3


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_tensors_are_what_the_converter_wrote_from_the_source(case, name):
    """LFM2: the source's tensors (the conv kernel unsqueezed back, the experts unstacked,
    the expert bias and the final norm renamed back). Falcon-H1: the source's times the
    multipliers folded in (c2.falcon_h1_fold, the converter's float32 products), A_log
    from A = -exp(A_log), D, the conv and the gated norm reshaped back."""
    from safetensors.torch import load_file

    t, path = case(name)
    ckpt = read_gguf(path)
    saved = load_file(str(t.path / "model.safetensors"))
    assert set(ckpt.tensors) == set(saved)
    falcon = CASES[name][0] == "falcon-h1"
    hp = c2.falcon_h1_hparams(t.hf.config.to_dict())
    for k, v in saved.items():
        want = c2.falcon_h1_fold(k, v.clone(), hp) if falcon else v
        if k.endswith("A_log"):
            torch.testing.assert_close(ckpt.tensors[k], want, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(ckpt.tensors[k], want), k


def test_falcon_h1_multipliers_are_folded_into_the_weights(case):
    """The fold is the multipliers of the source config (embedding, lm_head, key x
    attention_in, in_proj's five row blocks), and the config read back has them all 1."""
    t, path = case("falcon_h1")
    src, cfg = t.hf.config, read_gguf(path).config
    tensors = read_gguf(path).tensors
    sd = dict(t.hf.named_parameters())
    emb = "model.embed_tokens.weight"
    assert torch.equal(tensors[emb], sd[emb].detach() * src.embedding_multiplier)
    k = "model.layers.1.self_attn.k_proj.weight"
    assert torch.equal(tensors[k], sd[k].detach() * src.key_multiplier
                       * src.attention_in_multiplier)
    rows = tensors["model.layers.0.mamba.in_proj.weight"] / \
        sd["model.layers.0.mamba.in_proj.weight"].detach()
    d, gs = src.mamba_d_ssm, src.mamba_n_groups * src.mamba_d_state
    firsts = [0, d, 2 * d, 2 * d + gs, 2 * d + 2 * gs]
    got = [rows[r].median().item() for r in firsts]
    assert got == pytest.approx([m * src.ssm_in_multiplier for m in src.ssm_multipliers],
                                rel=1e-6)
    assert all(cfg[key] == 1.0 for key in ("embedding_multiplier", "lm_head_multiplier",
                                           "key_multiplier", "ssm_in_multiplier"))
    assert cfg["ssm_multipliers"] == [1.0] * 5 and cfg["mlp_multipliers"] == [1.0, 1.0]


@pytest.mark.parametrize("name, keys", [
    ("falcon_h1", ("hidden_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "head_dim", "intermediate_size", "mamba_d_ssm",
                   "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state",
                   "mamba_d_conv", "mamba_conv_bias", "mamba_rms_norm", "projectors_bias",
                   "tie_word_embeddings", "vocab_size", "rms_norm_eps")),
    ("falcon_h1_norm", ("mamba_rms_norm", "mamba_norm_before_gate", "mamba_n_groups",
                        "projectors_bias", "mlp_bias", "attention_bias")),
    ("lfm2", ("layer_types", "num_key_value_heads", "conv_L_cache", "conv_bias",
              "tie_word_embeddings", "norm_eps", "max_position_embeddings", "vocab_size")),
    ("lfm2_bias", ("layer_types", "conv_bias", "tie_word_embeddings")),
    ("lfm2_moe", ("layer_types", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "num_dense_layers", "use_expert_bias", "norm_topk_prob",
                  "routed_scaling_factor", "intermediate_size", "tie_word_embeddings")),
])
def test_gguf_metadata_gives_the_source_config(case, name, keys):
    t, path = case(name)
    cfg = read_gguf(path).config
    src = t.hf.config.to_dict()
    # float metadata is float32 in the file
    assert {k: pytest.approx(cfg[k], rel=1e-6) if isinstance(cfg[k], float) else cfg[k]
            for k in keys} == {k: src[k] for k in keys}
    theta = (src.get("rope_parameters") or {}).get("rope_theta")
    assert cfg["rope_theta"] == pytest.approx(theta, rel=1e-7)


def test_lfm2_mlp_width_is_written_adjusted(case):
    """The converter writes LFM2's MLP width after transformers' adjustment (96 -> 64 here):
    the config says so with block_auto_adjust_ff_dim false, as transformers' own GGUF
    conversion does, and parses to the source's width."""
    from mi_transformer.config import parse_config

    t, path = case("lfm2")
    cfg = read_gguf(path).config
    assert cfg["intermediate_size"] == 64 and cfg["block_auto_adjust_ff_dim"] is False
    assert parse_config(cfg, "gguf").intermediate_size == \
        parse_config(json.loads((t.path / "config.json").read_text()), "src").intermediate_size


@pytest.mark.parametrize("name", ["falcon_h1", "lfm2", "lfm2_moe"])
def test_cached_generation_from_the_gguf_equals_transformers(case, name):
    t, path = case(name)
    model = mi.MIModel.from_pretrained(path)
    assert_greedy_tokens_equal_transformers(t.hf, model, ssm_ids(1, 6, seed=4))


def test_transformers_reads_the_lfm2_gguf_and_its_config_loads_with_its_numbers(case,
                                                                               tmp_path):
    """transformers' own GGUF reader (``from_pretrained(..., gguf_file=...)``) gives the
    source's logits from the converter's file (an independent check of the file), and the
    config its conversion writes loads here with the same numbers."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    t, path = case("lfm2")
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval()
    ids = ssm_ids(1, 12, seed=7)
    with torch.no_grad():
        want = hf(ids).logits
        assert (want - t.hf(ids).logits).abs().max().item() < TOL
    out = tmp_path / "converted"
    hf.config.save_pretrained(out)
    tensors = {k: v.detach().clone().contiguous() for k, v in hf.state_dict().items()
               if k != "lm_head.weight"}
    save_file(tensors, str(out / "model.safetensors"))
    for written in (None, json.loads(json.dumps(hf.config.to_dict()))):
        if written is not None:
            (out / "config.json").write_text(json.dumps(written))
        got = mi.MIModel.from_pretrained(out).forward(ids).output
        assert (got - want).abs().max().item() < TOL


# ---------------------------------------------------------------- what the file cannot carry

def test_a_tied_falcon_h1_gguf_is_refused_naming_the_lost_head_multiplier(case, tmp_path):
    _, path = case("falcon_h1")
    tied = _rewrite(path, tmp_path / "tied.gguf", drop=("output.weight",))
    with pytest.raises(UnsupportedModelError, match=r"without output\.weight.*"
                                                    r"lm_head_multiplier"):
        read_gguf(tied)


@pytest.mark.parametrize("tensor, rows, mult", [
    ("blk.0.attn_q.bias", 48, "attention_in_multiplier"),
    ("blk.2.attn_k.bias", 24, "attention_in_multiplier"),
    ("blk.1.ssm_in.bias", 120, "ssm_in_multiplier"),
])
def test_falcon_h1_biases_scaled_by_an_input_multiplier_are_refused(case, tmp_path, tensor,
                                                                    rows, mult):
    _, path = case("falcon_h1")
    bad = _rewrite(path, tmp_path / "bias.gguf", add={tensor: np.zeros(rows, np.float32)})
    with pytest.raises(UnsupportedModelError, match=rf"'{tensor}'.*{mult}"):
        read_gguf(bad)


@pytest.mark.parametrize("change", [
    {"meta": {"falcon-h1.key_multiplier": (0.39, "FLOAT32")}},
    {"meta": {"falcon-h1.ssm.has_mup": (True, "BOOL")}},
    {"add": {"blk.0.ssm_mup_vec": np.ones((1, 1, 120), np.float32)}},
])
def test_a_falcon_h1_gguf_of_the_pre_upstream_converter_is_refused(case, tmp_path, change):
    """tiiuae's first converter (llama.cpp-Falcon-H1) wrote the multipliers as metadata and
    the mup vector as tensors beside unfolded weights: refused by name, not read as folded."""
    _, path = case("falcon_h1")
    fork = _rewrite(path, tmp_path / "fork.gguf", **change)
    with pytest.raises(UnsupportedModelError, match=r"(key_multiplier|has_mup|ssm_mup_vec)"
                                                    r".*pre-upstream"):
        read_gguf(fork)


def test_lfm2moe_routed_scaling_comes_from_expert_weights_scale_or_is_one(case, tmp_path):
    """The converter writes no routed_scaling_factor (llama.cpp scales the chosen weights by
    ``expert_weights_scale`` when present): the tiny recipe's 1.5 is lost in the file (1.0,
    the released value, read back) and comes back, with transformers' numbers, when the key
    is written."""
    t = make_tiny_hybrid2(tmp_path, "lfm2_moe")  # routed_scaling_factor 1.5
    path = _convert(t, "lfm2moe", tmp_path / "scaled.gguf")
    assert read_gguf(path).config["routed_scaling_factor"] == 1.0
    scaled = _rewrite(path, tmp_path / "with_scale.gguf",
                      meta={"lfm2moe.expert_weights_scale": (1.5, "FLOAT32")})
    assert read_gguf(scaled).config["routed_scaling_factor"] == 1.5
    ids = ssm_ids(2, 12, seed=5)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (mi.MIModel.from_pretrained(scaled).forward(ids).output - ref).abs().max() < TOL


# ------------------------------------------------------------------------- malformed files

@pytest.mark.parametrize("name, key, value, error", [
    ("lfm2", "lfm2.attention.head_count_kv", ([0, 0, 2], "ARRAY"), ConfigError),
    ("lfm2_moe", "lfm2moe.attention.head_count_kv", ([0, 2, 1, 0], "ARRAY"), ConfigError),
    ("lfm2", "lfm2.shortconv.l_cache", (None, ""), ConfigError),
    ("lfm2_moe", "lfm2moe.expert_feed_forward_length", (None, ""), ConfigError),
    ("falcon_h1", "falcon-h1.ssm.time_step_rank", (None, ""), ConfigError),
    ("falcon_h1", "falcon-h1.ssm.time_step_rank", (7, "UINT32"), ConfigError),
    ("falcon_h1", "falcon-h1.block_count", (2**32 - 1, "UINT32"), ConfigError),
    ("lfm2_moe", "lfm2moe.block_count", (3, "UINT32"), ConfigError),
    ("falcon_h1", "falcon-h1.attention.scale", (0.5, "FLOAT32"), UnsupportedModelError),
    ("falcon_h1", "falcon-h1.rope.scaling.type", ("yarn", "STRING"), UnsupportedModelError),
    ("lfm2", "lfm2.attention.sliding_window", (4, "UINT32"), UnsupportedModelError),
    ("lfm2", "lfm2.attention.causal", (False, "BOOL"), UnsupportedModelError),
    ("lfm2_moe", "lfm2moe.expert_gating_func", (1, "UINT32"), UnsupportedModelError),
    ("lfm2_moe", "lfm2moe.expert_weights_norm", (False, "BOOL"), UnsupportedModelError),
])
def test_malformed_or_unsupported_metadata_is_a_typed_error_naming_the_key(case, tmp_path,
                                                                           name, key, value,
                                                                           error):
    _, path = case(name)
    bad = _rewrite(path, tmp_path / "meta.gguf", meta={key: value})
    with pytest.raises(error, match=key.replace(".", r"\.")):
        read_gguf(bad)


@pytest.mark.parametrize("name, tensor, shape", [
    ("lfm2", "blk.1.shortconv.conv.weight", (32, 4)),
    ("lfm2_moe", "blk.2.ffn_up_exps.weight", (4, 8, 32)),
    ("falcon_h1", "blk.0.ssm_norm.weight", (2, 24)),
    ("falcon_h1_norm", "blk.1.ssm_norm.weight", (4, 12)),
])
def test_a_mis_shaped_or_unexpected_tensor_is_a_weight_load_error_naming_it(case, tmp_path,
                                                                            name, tensor,
                                                                            shape):
    _, path = case(name)
    r = gguf.GGUFReader(str(path))
    have = {x.name for x in r.tensors}
    arr = np.zeros(shape, np.float32)
    bad = _rewrite(path, tmp_path / "t.gguf", **({"tensors": {tensor: arr}} if tensor in have
                                                 else {"add": {tensor: arr}}))
    with pytest.raises(WeightLoadError, match=tensor.replace(".", r"\.")):
        read_gguf(bad)


def test_a_general_architecture_that_is_not_a_string_is_refused(case, tmp_path):
    _, path = case("lfm2")
    bad = _rewrite(path, tmp_path / "arch.gguf", meta={"general.architecture": ([0], "ARRAY")})
    with pytest.raises(UnsupportedModelError, match=r"GGUF architecture \[0\]"):
        read_gguf(bad)


def test_attention_layers_that_are_not_the_tensors_are_named(case, tmp_path):
    """The per-layer KV heads mark layer 1 as attention, whose tensors are a convolution's."""
    _, path = case("lfm2")
    bad = _rewrite(path, tmp_path / "kv.gguf",
                   meta={"lfm2.attention.head_count_kv": ([0, 2, 0, 0], "ARRAY")})
    with pytest.raises(ConfigError, match=r"head_count_kv \(\[1\]\).*tensors \(\[2\]\)"):
        read_gguf(bad)


def test_a_positive_falcon_h1_ssm_a_is_a_weight_load_error_naming_it(case, tmp_path):
    _, path = case("falcon_h1")
    r = gguf.GGUFReader(str(path))
    a = next(np.array(x.data) for x in r.tensors if x.name == "blk.2.ssm_a")
    bad = _rewrite(path, tmp_path / "a.gguf", tensors={"blk.2.ssm_a": np.abs(a)})
    with pytest.raises(WeightLoadError, match=r"blk\.2\.ssm_a.*negative"):
        read_gguf(bad)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["falcon_h1", "lfm2", "lfm2_moe"])
def test_fuzzed_metadata_values_fail_only_with_mi_errors(case, tmp_path_factory, name):
    """Any value of any GGUF type at any of the architecture's keys either loads or raises an
    MIError."""
    from tests.support.gguf_fuzz import fuzz_metadata

    _, good = case(name)
    arch = CASES[name][0]
    keys = [k for k in read_gguf(good).metadata if k.startswith(f"{arch}.")]
    fuzz_metadata(keys, lambda path, meta: _rewrite(good, path, meta=meta), read_gguf,
                  tmp_path_factory.mktemp("fuzz_hybrid2"))
