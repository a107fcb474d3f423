"""Bad CLT directories and mismatched models raise DictionaryError naming the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import mi_core as mi
from mi_clt.attribution import attribute

FIX = Path(__file__).parent / "fixtures"


def _copy(tmp_path: Path, name: str = "attr_clt") -> Path:
    d = tmp_path / name
    shutil.copytree(FIX / name, d)
    return d


def test_missing_decoder_file_names_it(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    (d / "W_dec_1.safetensors").unlink()
    with pytest.raises(mi.DictionaryError, match="W_dec_1.safetensors"):
        mi.load_dictionary(d)


def test_gap_in_encoder_files_names_the_missing_one(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    (d / "W_enc_1.safetensors").unlink()
    with pytest.raises(mi.DictionaryError, match="W_enc_1.safetensors"):
        mi.load_dictionary(d)


def test_missing_transcoder_listed_in_config_names_it(tmp_path: Path) -> None:
    d = _copy(tmp_path, "tset")
    (d / "layer_2.safetensors").unlink()
    with pytest.raises(mi.DictionaryError, match="layer_2.safetensors"):
        mi.load_dictionary(d)


def test_misshaped_decoder_names_file_and_tensor(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    w = load_file(str(d / "W_dec_0.safetensors"))["W_dec_0"]
    save_file({"W_dec_0": w[:, :2].contiguous()}, str(d / "W_dec_0.safetensors"))
    with pytest.raises(mi.DictionaryError, match=r"W_dec_0.safetensors.*'W_dec_0'.*\[32, 2, 16\]"):
        mi.load_dictionary(d)


def test_truncated_file_is_reported(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    p = d / "W_enc_2.safetensors"
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(mi.DictionaryError, match="W_enc_2.safetensors"):
        mi.load_dictionary(d)


def test_unknown_directory_lists_what_was_looked_for(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(mi.DictionaryError, match="W_enc_"):
        mi.load_dictionary(tmp_path)


@pytest.fixture(scope="module")
def tiny():
    return mi.MIModel.from_pretrained(FIX / "tiny_llama")


def test_layer_count_mismatch_with_model(tmp_path: Path, tiny) -> None:
    d = _copy(tmp_path)
    for i in (2,):
        (d / f"W_enc_{i}.safetensors").unlink()
        (d / f"W_dec_{i}.safetensors").unlink()
    # layer 0/1 decoders still span 3 layers: fix them to span 2 so the CLT itself is valid
    for i in (0, 1):
        w = load_file(str(d / f"W_dec_{i}.safetensors"))[f"W_dec_{i}"]
        save_file({f"W_dec_{i}": w[:, : 2 - i].contiguous()}, str(d / f"W_dec_{i}.safetensors"))
    clt = mi.load_dictionary(d)
    assert clt.n_layers == 2
    with pytest.raises(mi.DictionaryError, match=r"2 layers but the model has 3"):
        attribute(tiny, clt, [0, 1, 2])


def test_d_model_mismatch_names_the_encoder_file(tmp_path: Path, tiny) -> None:
    mi.load_dictionary(FIX / "clt_relu").check_model(tiny)  # d_model 16 like the model: fine
    d = tmp_path / "d8"
    d.mkdir()
    for i in range(3):  # a valid CLT for a d_model = 8 model
        save_file({f"W_enc_{i}": torch.randn(4, 8), f"b_enc_{i}": torch.zeros(4),
                   f"b_dec_{i}": torch.zeros(8)}, str(d / f"W_enc_{i}.safetensors"))
        save_file({f"W_dec_{i}": torch.randn(4, 3 - i, 8)}, str(d / f"W_dec_{i}.safetensors"))
    clt = mi.load_dictionary(d)
    with pytest.raises(mi.DictionaryError, match=r"W_enc_0.safetensors.*d_model is 8"):
        clt.encode_model(tiny, torch.tensor([[0, 1, 2]]))


def test_config_naming_a_hook_the_model_lacks(tmp_path: Path, tiny) -> None:
    d = _copy(tmp_path)
    (d / "config.yaml").write_text("model_kind: cross_layer_transcoder\n"
                                   "feature_input_hook: hook_resid_middle\n"
                                   "feature_output_hook: hook_mlp_out\n")
    clt = mi.load_dictionary(d)
    with pytest.raises(mi.DictionaryError, match=r"config.yaml.*hook_resid_middle"):
        clt.encode_model(tiny, torch.tensor([[0, 1, 2]]))


def test_bad_config_values(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    (d / "config.yaml").write_text("model_kind: cross_layer_transcoder\nactivation: gelu\n")
    with pytest.raises(mi.DictionaryError, match=r"config.yaml.*gelu"):
        mi.load_dictionary(d)
    (d / "config.yaml").write_text("model_kind: transcoder_set\ntranscoders: [hf://a/b/c.safetensors]\n")
    (d / "W_enc_0.safetensors").unlink()
    with pytest.raises(mi.DictionaryError, match=r"hub URI"):
        mi.load_dictionary(d)
