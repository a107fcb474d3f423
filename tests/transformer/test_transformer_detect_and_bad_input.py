"""Detection (known families, LLaMA-like auto-config, incompatible checkpoints) and bad input:
each a typed error naming the culprit, or a warning where the result is merely degraded."""

from __future__ import annotations

import json

import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, TokenizerError, UnsupportedModelError, WeightLoadError
from mi_core.registry import ModelSource
from mi_transformer import plugin
from tests.support.checkpoint_variants import load_direct, source_of, variant


def test_known_family_is_detected_with_a_high_score(tiny):
    d = plugin.mi_detect_backend(source=source_of(tiny("qwen3").path))
    assert d.score >= 0.9 and "qwen3" in d.reason


def test_llama_like_unknown_model_type_loads_by_auto_config_and_matches(tiny, make_ids,
                                                                        tmp_path):
    t = tiny("llama")
    path = variant(t.path, tmp_path / "mine", lambda c: c.update(model_type="my_llama"))
    d = plugin.mi_detect_backend(source=source_of(path))
    assert 0 < d.score < 0.9 and "auto-config" in d.reason
    ids = make_ids(2, 10)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (load_direct(path).forward(ids).output - ref).abs().max().item() < 1e-4


def test_incompatible_unknown_checkpoint_lists_missing_and_unexpected_tensors(tiny, tmp_path):
    def rename(ts: dict) -> None:
        for k in [k for k in ts if "mlp.gate_proj" in k]:
            ts[k.replace("mlp.gate_proj", "mlp.w1")] = ts.pop(k)

    path = variant(tiny("llama").path, tmp_path / "odd",
                    lambda c: c.update(model_type="oddformer"), rename)
    d = plugin.mi_detect_backend(source=source_of(path))
    assert d.score == 0
    assert "model.layers.0.mlp.gate_proj.weight" in d.missing
    assert "model.layers.0.mlp.w1.weight" in d.unexpected
    with pytest.raises(UnsupportedModelError, match="mlp.w1"):
        load_direct(path)


def test_from_pretrained_and_check_compatibility_go_through_the_plugin(tiny, make_ids):
    t = tiny("mistral")
    report = mi.check_compatibility(t.path)
    assert report.supported and report.backend == "transformer"
    model = mi.MIModel.from_pretrained(t.path)
    ids = make_ids(1, 6)
    with torch.no_grad():
        assert (model.forward(ids).output - t.hf(ids).logits).abs().max().item() < 1e-4


def test_gguf_file_is_claimed_and_other_single_files_are_not(tmp_path):
    g, other = tmp_path / "m.gguf", tmp_path / "m.bin"
    g.write_bytes(b"GGUF")
    other.write_bytes(b"x")
    assert plugin.mi_detect_backend(source=ModelSource(path=g)).score > 0
    assert plugin.mi_detect_backend(source=ModelSource(path=other)).score == 0


def test_missing_config_field_names_field_and_file(tiny, tmp_path):
    path = variant(tiny("llama").path, tmp_path / "nofield", lambda c: c.pop("hidden_size"))
    with pytest.raises(ConfigError, match="hidden_size") as e:
        load_direct(path)
    assert "config.json" in str(e.value)


def test_wrongly_shaped_tensor_names_tensor_and_shapes(tiny, tmp_path):
    def shrink(ts: dict) -> None:
        ts["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(16, 64)

    path = variant(tiny("llama").path, tmp_path / "shape", tensor_edit=shrink)
    with pytest.raises(WeightLoadError, match=r"model.layers.1.self_attn.k_proj.weight: \[16, 64\]"):
        load_direct(path)


def test_missing_tensor_is_named(tiny, tmp_path):
    path = variant(tiny("qwen2_untied").path, tmp_path / "nohead",
                    tensor_edit=lambda ts: ts.pop("lm_head.weight"))
    with pytest.raises(WeightLoadError, match="lm_head.weight"):
        load_direct(path)


def test_truncated_safetensors_is_a_weight_load_error(tiny, tmp_path):
    path = variant(tiny("llama").path, tmp_path / "trunc")
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(WeightLoadError, match="truncated"):
        load_direct(path)


def test_ids_out_of_vocabulary_are_a_tokenizer_error(llama_model):
    with pytest.raises(TokenizerError, match="128"):
        llama_model.forward(torch.tensor([[1, 2, 128]]))


def test_sequence_past_max_positions_is_refused_or_warns_when_allowed(tiny, make_ids):
    model = tiny("mistral").load()  # max_position_embeddings 64 (conftest)
    with pytest.raises(mi.InputError, match="context of 64"):
        model.forward(make_ids(1, 70))
    with pytest.warns(UserWarning, match="max_position_embeddings 64"):
        out = model.forward(make_ids(1, 70), allow_beyond_context=True).output
    assert torch.isfinite(out).all()


def test_unknown_forward_option_is_an_error_not_ignored(llama_model):
    with pytest.raises(mi.MIError, match="layer_shedule"):
        llama_model.forward(torch.tensor([[3, 4]]), layer_shedule=[0])
    with pytest.raises(mi.MIError, match="attn_impl"):
        llama_model.forward(torch.tensor([[3, 4]]), attn_impl="flash")
