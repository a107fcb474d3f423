"""GGUF files of Nemotron-H with mixture-of-experts layers (Nemotron 3): llama.cpp's
``nemotron_h_moe``.

The tiny checkpoints are tests/ssm/test_ssm_nemotron_moe.py's (transformers 5.24, F32, unit
scale, hidden 64, 4 layers, 8 experts top-3 in 4 groups of which 2 are kept, routed scale 2.5,
a non-zero selection bias): transformers' default schedule (Mamba-2, MoE, attention, dense
MLP) and one with two MoE layers behind a latent projection (``moe_latent_size`` 24, no
renormalisation). Each is written as llama.cpp's converter writes it by
tests/support/gguf_convert_hybrid.py (``NemotronHModel`` with ``is_moe``; written without
mi_transformer.gguf). Reference: transformers on the source checkpoint; F32 logits and every
layer's residual stream max abs diff < 1e-4, cached greedy tokens equal. Every tensor comes
back bit-identical but A_log (log(-(-exp(A_log))) in float32, to 1e-6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, UnsupportedModelError, WeightLoadError
from mi_transformer.gguf import read_gguf
from tests.support import gguf_convert as conv
from tests.support import gguf_convert_hybrid as ch
from tests.support.family_checks import assert_greedy_tokens_equal_transformers
from tests.ssm.test_ssm_nemotron_moe import CASES, _ids, _tiny
from tests.transformer.test_transformer_gguf_new_arches import _rewrite

gguf = pytest.importorskip("gguf")
pytest.importorskip("mi_ssm")
TOL = 1e-4
ARCH = "nemotron_h_moe"


def _convert(name: str, out: Path) -> Path:
    from safetensors.torch import load_file

    t = _tiny(name)
    sd = load_file(str(t.path / "model.safetensors"))
    hp = ch.nemotron_h_moe_hparams(t.hf.config.to_dict())
    return conv.write(out, ARCH, t.hf.config, sd, hp=hp, params=ch.nemotron_h_moe_params,
                      modify=ch.nemotron_h_moe_modify(hp))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_nemotron_moe")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = _convert(name, root / f"{name}.gguf")
        return made[name]

    return get


@pytest.mark.parametrize("name", sorted(CASES))
def test_gguf_logits_and_residual_stream_equal_transformers(files, name):
    t, model = _tiny(name), mi.MIModel.from_pretrained(files(name))
    assert model.layer_types == CASES[name][1]
    ids = _ids(2, 19, seed=5)
    with torch.no_grad():
        ref = t.hf(ids, output_hidden_states=True)
    L = model.num_layers
    cache = model.forward(ids, mi.HookSpec().capture_all(
        [mi.HookPoint.resid_pre(i) for i in range(L)]))
    assert (cache.output - ref.logits).abs().max().item() < TOL
    for i in range(L):
        assert (cache[mi.HookPoint.resid_pre(i)] - ref.hidden_states[i]).abs().max() < TOL, i
    assert cache.output.std().item() > 0.3


@pytest.mark.parametrize("name", sorted(CASES))
def test_gguf_tensors_are_the_source_tensors(files, name):
    """Stacked experts split back per expert, the q / k rows unpermuted, the selection bias,
    router, shared expert and latent projections under their checkpoint names."""
    from safetensors.torch import load_file

    ckpt = read_gguf(files(name))
    saved = load_file(str(_tiny(name).path / "model.safetensors"))
    assert set(ckpt.tensors) == set(saved)
    for k, v in saved.items():
        if k.endswith("A_log"):
            torch.testing.assert_close(ckpt.tensors[k], v, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(ckpt.tensors[k], v), k


@pytest.mark.parametrize("name", sorted(CASES))
def test_gguf_metadata_gives_the_source_config(files, name):
    cfg = read_gguf(files(name)).config
    src = _tiny(name).hf.config.to_dict()
    keys = ["n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
            "moe_shared_expert_intermediate_size", "norm_topk_prob", "n_group", "topk_group",
            "head_dim", "mamba_num_heads", "mamba_head_dim", "n_groups", "num_key_value_heads"]
    if name == "latent":
        keys.append("moe_latent_size")
    assert {k: cfg[k] for k in keys} == {k: src[k] for k in keys}
    assert cfg["routed_scaling_factor"] == pytest.approx(src["routed_scaling_factor"])
    want = "".join({"mamba2": "M", "moe": "E", "full_attention": "*", "mlp": "-"}[k]
                   for k in CASES[name][1])
    assert cfg["hybrid_override_pattern"] == want


def test_the_dense_mlp_layer_the_converter_leaves_without_width_is_told_by_its_tensors(files):
    """The converter writes feed_forward_length only on the ``E`` layers: the default
    schedule's dense MLP layer has 0 KV heads and width 0 (llama.cpp would take it for a
    Mamba-2 layer); its ffn_up / ffn_down and the absent ssm_in make it the MLP layer."""
    path = files("default")
    md = {f.name: f.contents() for f in gguf.GGUFReader(str(path)).fields.values()}
    assert md[f"{ARCH}.feed_forward_length"][3] == 0
    assert md[f"{ARCH}.attention.head_count_kv"][3] == 0
    assert read_gguf(path).config["intermediate_size"] == 48  # the source's


@pytest.mark.parametrize("name", sorted(CASES))
def test_cached_generation_from_the_gguf_equals_transformers(files, name):
    model = mi.MIModel.from_pretrained(files(name))
    assert_greedy_tokens_equal_transformers(_tiny(name).hf, model, _ids(1, 6, seed=4))


@pytest.mark.parametrize("key", ["expert_count", "expert_used_count",
                                 "expert_shared_feed_forward_length", "ssm.inner_size"])
def test_a_missing_required_key_is_a_config_error_naming_it(files, tmp_path, key):
    bad = _rewrite(files("default"), tmp_path / "bad.gguf", meta={f"{ARCH}.{key}": (None, "")})
    with pytest.raises(ConfigError, match=f"'{ARCH}.{key}'"):
        read_gguf(bad)


@pytest.mark.parametrize("tensor", ["blk.1.exp_probs_b.bias", "blk.1.ffn_up_shexp.weight",
                                    "blk.1.ffn_down_exps.weight"])
def test_a_missing_tensor_is_a_weight_load_error_naming_it(files, tmp_path, tensor):
    bad = _rewrite(files("default"), tmp_path / "bad.gguf", drop=(tensor,))
    with pytest.raises(WeightLoadError, match="model.layers.1|backbone.layers.1"):
        read_gguf(bad)


def test_a_missing_router_is_named(files, tmp_path):
    bad = _rewrite(files("default"), tmp_path / "bad.gguf", drop=("blk.1.ffn_gate_inp.weight",))
    with pytest.raises(ConfigError, match="blk.1.ffn_gate_inp.weight"):
        read_gguf(bad)


def test_a_missing_latent_projection_or_size_is_named(files, tmp_path):
    no_size = _rewrite(files("latent"), tmp_path / "a.gguf",
                       meta={f"{ARCH}.moe_latent_size": (None, "")})
    with pytest.raises(ConfigError, match="moe_latent_size"):
        read_gguf(no_size)
    no_proj = _rewrite(files("latent"), tmp_path / "b.gguf",
                       drop=("blk.3.ffn_latent_up.weight",))
    with pytest.raises(WeightLoadError, match="fc2_latent_proj"):
        read_gguf(no_proj)


def test_expert_groups_without_the_kept_count_are_refused(files, tmp_path):
    """llama.cpp's nemotron_h_moe routes without the group limit and its converter writes
    ``n_group`` only; ``topk_group`` reaches the file as the generic
    ``expert_group_used_count``. Without it the routing is not in the file: refused."""
    bad = _rewrite(files("default"), tmp_path / "bad.gguf",
                   meta={f"{ARCH}.expert_group_used_count": (None, "")})
    with pytest.raises(UnsupportedModelError, match="expert_group_used_count"):
        read_gguf(bad)
    one = _rewrite(files("default"), tmp_path / "one.gguf",
                   meta={f"{ARCH}.expert_group_used_count": (None, ""),
                         f"{ARCH}.expert_group_count": (1, "UINT32")})
    cfg: dict[str, Any] = read_gguf(one).config
    assert (cfg["n_group"], cfg["topk_group"]) == (1, 1)


def test_a_softmax_gating_func_is_refused(files, tmp_path):
    bad = _rewrite(files("default"), tmp_path / "bad.gguf",
                   meta={f"{ARCH}.expert_gating_func": (1, "UINT32")})
    with pytest.raises(UnsupportedModelError, match="expert_gating_func"):
        read_gguf(bad)
