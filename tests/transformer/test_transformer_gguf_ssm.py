"""GGUF files of the state-space families: llama.cpp's ``mamba`` (Mamba, Falcon-Mamba),
``mamba2`` and the hybrid ``jamba``, whose layers run mi-ssm's mixers.

Each tiny checkpoint (tests/support/ssm_tiny.py: unit scale, the settings released ones use)
is written as llama.cpp's converter writes it by tests/support/gguf_convert.py
(``MambaModel`` / ``Mamba2Model`` of ggml-org/llama.cpp ``conversion/mamba.py`` @ 32e9e044:
A = -exp(A_log), the conv squeezed, Mamba-2's A / D [heads, 1], ``dt_bias`` as
``dt_proj.bias``, its gated norm [groups, d_inner / groups]; ``JambaModel`` of
``conversion/jamba.py`` @ 7bca1fd9: the attention schedule as per-layer KV heads, experts
stacked). Reference: transformers on the
source checkpoint; F32 logits max abs diff < 1e-4. Every tensor comes back bit-identical but
A_log, which is log(-(-exp(A_log))) in float32 (to 1e-6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, WeightLoadError
from mi_transformer.gguf import read_gguf
from tests.support import gguf_convert as conv
from tests.support.family_checks import assert_greedy_tokens_equal_transformers
from tests.support.hybrid_tiny import make_tiny_hybrid
from tests.support.ssm_tiny import make_tiny_ssm, ssm_ids

gguf = pytest.importorskip("gguf")
pytest.importorskip("mi_ssm")
TOL = 1e-4

#: name -> (GGUF arch, params, modify)
CASES = {"mamba": ("mamba", conv.mamba_params, conv.mamba_modify),
         "falcon_mamba": ("mamba", conv.mamba_params, conv.mamba_modify),
         "mamba2": ("mamba2", conv.mamba2_params, conv.mamba2_modify),
         "jamba": ("jamba", conv.jamba_params, conv.jamba_modify)}


def _write(t: Any, name: str, out: Path) -> Path:
    from safetensors.torch import load_file

    arch, params, modify = CASES[name]
    sd = load_file(str(t.path / "model.safetensors"))
    return conv.write(out, arch, t.hf.config, sd, params=params, modify=modify, generic=False)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    made: dict[str, tuple[Any, Path]] = {}
    root = tmp_path_factory.mktemp("gguf_ssm")

    def get(name: str) -> tuple[Any, Path]:
        if name not in made:
            t = (make_tiny_hybrid if name == "jamba" else make_tiny_ssm)(root, name)
            made[name] = (t, _write(t, name, root / f"{name}.gguf"))
        return made[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_logits_equal_transformers_on_the_source_checkpoint(case, name):
    t, path = case(name)
    model = mi.MIModel.from_pretrained(path)
    assert model.config.model_type == name
    ids = ssm_ids(2, 20, seed=9)
    with torch.no_grad():
        ref = t.hf(ids).logits
    got = model.forward(ids).output
    assert (got - ref).abs().max().item() < TOL
    assert got.std().item() > 0.1


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_tensors_are_the_source_tensors(case, name):
    from safetensors.torch import load_file

    t, path = case(name)
    ckpt = read_gguf(path)
    saved = load_file(str(t.path / "model.safetensors"))
    assert set(ckpt.tensors) == set(saved)
    for k, v in saved.items():
        if k.endswith("A_log"):
            torch.testing.assert_close(ckpt.tensors[k], v, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(ckpt.tensors[k], v), k


def test_gguf_config_is_the_source_config(case):
    t, path = case("mamba2")
    cfg = read_gguf(path).config
    src = t.hf.config
    for key in ("num_heads", "head_dim", "n_groups", "state_size", "conv_kernel", "expand",
                "use_conv_bias", "use_bias", "vocab_size", "tie_word_embeddings"):
        assert cfg[key] == getattr(src, key), key


def test_cached_generation_from_the_gguf_equals_transformers(case):
    t, path = case("mamba")
    model = mi.MIModel.from_pretrained(path)
    assert_greedy_tokens_equal_transformers(t.hf, model, ssm_ids(1, 6, seed=4))


def test_a_positive_ssm_a_is_a_weight_load_error_naming_it(case, tmp_path):
    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, path = case("mamba")
    r = gguf.GGUFReader(str(path))
    a = next(np.array(x.data) for x in r.tensors if x.name == "blk.1.ssm_a")
    bad = _rewrite(path, tmp_path / "a.gguf", tensors={"blk.1.ssm_a": np.abs(a)})
    with pytest.raises(WeightLoadError, match=r"blk\.1\.ssm_a.*negative"):
        read_gguf(bad)


def test_missing_ssm_metadata_is_a_config_error_naming_it(case, tmp_path):
    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, path = case("mamba2")
    bad = _rewrite(path, tmp_path / "k.gguf", meta={"mamba2.ssm.state_size": (None, "")})
    with pytest.raises(ConfigError, match=r"mamba2\.ssm\.state_size"):
        read_gguf(bad)


def test_jamba_schedules_come_back_from_the_gguf(case):
    """The same attention and expert layers (the schedule found may be another period /
    offset giving them: layer 2 of 4 is period 3 as well as 4)."""
    from mi_transformer.config import parse_config

    t, path = case("jamba")
    cfg = read_gguf(path).config
    got, want = parse_config(cfg), parse_config(t.hf.config.to_dict())
    assert got.layer_mixers == want.layer_mixers and got.layer_moe == want.layer_moe
    for key in ("num_experts", "num_key_value_heads", "mamba_dt_rank", "mamba_expand"):
        assert cfg[key] == getattr(t.hf.config, key), key


def test_a_jamba_attention_schedule_that_is_not_periodic_is_refused(case, tmp_path):
    from mi_core.errors import UnsupportedModelError
    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, path = case("jamba")
    bad = _rewrite(path, tmp_path / "kv.gguf",
                   meta={"jamba.attention.head_count_kv": ([2, 0, 2, 2], "ARRAY")})
    with pytest.raises(UnsupportedModelError, match=r"attention layers \[0, 2, 3\]"):
        read_gguf(bad)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mamba", "mamba2", "jamba"])
def test_fuzzed_metadata_values_fail_only_with_mi_errors(case, tmp_path_factory, name):
    """Any value of any GGUF type at any of the architecture's keys either loads or raises an
    MIError."""
    from tests.support.gguf_fuzz import fuzz_metadata
    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, good = case(name)
    arch = CASES[name][0]
    keys = [k for k in read_gguf(good).metadata if k.startswith(f"{arch}.")]
    fuzz_metadata(keys, lambda path, meta: _rewrite(good, path, meta=meta), read_gguf,
                  tmp_path_factory.mktemp("fuzz_ssm"))
