"""GGUF files of the 2025-26 families llama.cpp converts without changing tensors: EXAONE-4
(``exaone4``, with and without sliding layers), Seed-OSS (``seed_oss``), ERNIE-4.5 dense
(``ernie4_5``) and OLMo-3 (written by llama.cpp as ``olmo2`` with sliding-window metadata).

Written here with the `gguf` package's GGUFWriter the way llama.cpp's convert_hf_to_gguf.py
writes them (names from ``gguf.get_tensor_name_map``, the per-layer sliding pattern as a
bool array), by the helpers of test_transformer_gguf_arches.py. Reference: transformers on
the source checkpoint; logits max abs diff < 1e-4 (F32).
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, UnsupportedModelError
from mi_transformer.gguf import read_gguf
from tests.support.byte_tokens import gpt2_byte_tokens
from tests.support.tiny_families import FAMILIES
from tests.transformer.conftest import make_tiny

gguf = pytest.importorskip("gguf")
from tests.transformer.test_transformer_gguf_arches import _add_tensors, _metadata  # noqa: E402

_OLMO3 = {"sliding_window": 5, "layer_types": ["sliding_attention", "full_attention",
                                              "sliding_attention"],
          "rope_parameters": {t: {"rope_type": "default", "rope_theta": 700.0}
                              for t in ("full_attention", "sliding_attention")}}
#: name -> (gguf arch, model_type, HF overrides)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "exaone4": ("exaone4", "exaone4", FAMILIES["exaone4"][1]),
    "exaone4_global": ("exaone4", "exaone4", FAMILIES["exaone4_global"][1]),
    "seed_oss": ("seed_oss", "seed_oss", FAMILIES["seed_oss"][1]),
    "ernie4_5": ("ernie4_5", "ernie4_5", FAMILIES["ernie4_5"][1]),
    "olmo3": ("olmo2", "olmo3", _OLMO3),
}


def _write(t: Any, arch: str, out: Path, meta: dict[str, Any] | None = None) -> Path:
    cfg = t.hf.config
    rp = cfg.rope_parameters
    view = types.SimpleNamespace(**{k: getattr(cfg, k) for k in (
        "head_dim", "hidden_size", "num_attention_heads", "max_position_embeddings",
        "intermediate_size", "num_hidden_layers", "num_key_value_heads", "rms_norm_eps",
        "vocab_size", "tie_word_embeddings") if hasattr(cfg, k)})
    view.rope_parameters = rp.get("full_attention", rp)  # one base: OLMo-3's are equal here
    from safetensors.torch import load_file

    w = gguf.GGUFWriter(str(out), arch)
    for key, (value, vtype) in _metadata(view, arch).items():
        w.add_key_value(key, value, gguf.GGUFValueType[vtype])
    window = getattr(cfg, "sliding_window", None)
    if window is not None:  # convert_hf_to_gguf: add_sliding_window(_pattern)
        w.add_uint32(f"{arch}.attention.sliding_window", window)
        w.add_array(f"{arch}.attention.sliding_window_pattern",
                    [t == "sliding_attention" for t in cfg.layer_types])
    for key, value in (meta or {}).items():
        w.add_key_value(key, value[0], gguf.GGUFValueType[value[1]])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(gpt2_byte_tokens(cfg.vocab_size))
    w.add_token_types([1] * cfg.vocab_size)
    _add_tensors(w, load_file(str(t.path / "model.safetensors")), view, arch)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_recent")
    made: dict[str, tuple[Any, Path]] = {}

    def get(name: str) -> tuple[Any, Path]:
        if name not in made:
            arch, model_type, overrides = CASES[name]
            t = make_tiny(root, name, model_type, overrides)
            made[name] = (t, _write(t, arch, root / f"{name}.gguf"))
        return made[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_equals_transformers_on_the_source_checkpoint(tiny_gguf, make_ids, name):
    t, path = tiny_gguf(name)
    ckpt = read_gguf(path)
    assert ckpt.config["model_type"] == CASES[name][1]
    model = mi.MIModel.from_pretrained(path)
    ids = make_ids(2, 12, seed=51)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (model.forward(ids).output - ref).abs().max().item() < 1e-4
    assert model.layer_types == list(getattr(t.hf.config, "layer_types", None)
                                     or ["full_attention"] * 3)


def test_olmo3_gguf_with_rope_scaling_is_refused(tiny_gguf, tmp_path):
    t, _ = tiny_gguf("olmo3")
    path = _write(t, "olmo2", tmp_path / "olmo3_yarn.gguf", meta={
        "olmo2.rope.scaling.type": ("yarn", "STRING"),
        "olmo2.rope.scaling.factor": (4.0, "FLOAT32"),
        "olmo2.rope.scaling.original_context_length": (16, "UINT32")})
    with pytest.raises(UnsupportedModelError, match="OLMo-3"):
        read_gguf(path)


def test_sliding_window_without_a_per_layer_pattern_is_a_config_error(tiny_gguf, tmp_path):
    t, _ = tiny_gguf("exaone4")
    t.hf.config.sliding_window, types_ = None, t.hf.config.layer_types
    try:
        path = _write(t, "exaone4", tmp_path / "no_pattern.gguf",
                      meta={"exaone4.attention.sliding_window": (5, "UINT32")})
    finally:
        t.hf.config.sliding_window, t.hf.config.layer_types = 5, types_
    with pytest.raises(ConfigError, match="sliding_window_pattern"):
        read_gguf(path)
