"""Bad CLT directories and mismatched models raise DictionaryError naming the file."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import mi_core as mi
from mi_clt.attribution import attribute
from tests.support.bad_files import write_pickle_payload

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


# -- config.yaml: strict types ----------------------------------------------------------

@pytest.mark.parametrize("text, pattern", [
    ("model_kind: cross_layer_transcoder\nk: '4'\nactivation: topk\n", r"key 'k' = '4'"),
    ("model_kind: cross_layer_transcoder\nk: true\nactivation: topk\n", r"key 'k' = True"),
    ("model_kind: cross_layer_transcoder\nk: 1000\n", r"key 'k' = 1000: more than the 32"),
    ("model_kind: cross_layer_transcoder\nfeature_input_hook: 3\n", r"key 'feature_input_hook' = 3"),
    ("model_kind: cross_layer_transcoder\nactivation: [relu]\n", r"key 'activation' = \['relu'\]"),
    ("model_kind: clt\n", r"key 'model_kind' = 'clt'"),
    ("- a\n- b\n", r"must hold a YAML mapping"),
    ("model_kind: [unclosed\n", r"not valid YAML"),
])
def test_config_yaml_of_wrong_type_names_file_key_and_value(tmp_path: Path, text: str, pattern: str) -> None:
    d = _copy(tmp_path)
    (d / "config.yaml").write_text(text)
    with pytest.raises(mi.DictionaryError, match=rf"config\.yaml.*{pattern}"):
        mi.load_dictionary(d, format="circuit-tracer-clt")


def test_transcoder_list_entry_of_wrong_type_is_named(tmp_path: Path) -> None:
    d = _copy(tmp_path, "tset")
    (d / "config.yaml").write_text("model_kind: transcoder_set\ntranscoders:\n"
                                   "- {layer: '0', filepath: layer_0.safetensors}\n")
    with pytest.raises(mi.DictionaryError, match=r"config\.yaml: transcoders\[0\]\.layer = '0'"):
        mi.load_dictionary(d)
    (d / "config.yaml").write_text("model_kind: transcoder_set\ntranscoders: [7, 8]\n")
    with pytest.raises(mi.DictionaryError, match=r"config\.yaml: transcoders\[0\] = 7: expected a file path"):
        mi.load_dictionary(d)


# -- tensors -------------------------------------------------------------------------------

@pytest.mark.parametrize("file, tensor", [("W_enc_1.safetensors", "b_enc_1"),
                                          ("W_enc_2.safetensors", "W_enc_2"),
                                          ("W_dec_0.safetensors", "W_dec_0")])
def test_non_finite_tensor_names_file_and_tensor(tmp_path: Path, file: str, tensor: str) -> None:
    d = _copy(tmp_path)
    w = load_file(str(d / file))
    w[tensor].view(-1)[0] = float("nan")
    save_file(w, str(d / file))
    clt = None
    with pytest.raises(mi.DictionaryError, match=rf"{file.replace('.', chr(92) + '.')}: tensor '{tensor}' contains NaN"):
        clt = mi.load_dictionary(d)  # biases are checked at load
        layer = int(tensor[-1])
        clt.encoder(layer)  # an encoder when first used
        clt.decoder_rows(layer, None)  # decoder rows as they are read


def test_integer_tensor_is_refused_by_name(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    w = load_file(str(d / "W_enc_0.safetensors"))
    w["b_dec_0"] = w["b_dec_0"].to(torch.int32)
    save_file(w, str(d / "W_enc_0.safetensors"))
    with pytest.raises(mi.DictionaryError, match=r"W_enc_0\.safetensors: tensor 'b_dec_0' has dtype I32"):
        mi.load_dictionary(d)


# -- pickles: refused without unpickling -------------------------------------------------

def test_pickle_files_are_refused_by_name_and_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    d = tmp_path / "clt"
    d.mkdir()
    for name in ("W_enc_0.pt", "W_dec_0.pth", "transcoder.pkl"):
        write_pickle_payload(d / name, marker)
    with pytest.raises(mi.DictionaryError, match=r"refusing pickle file\(s\) W_dec_0\.pth, W_enc_0\.pt, transcoder\.pkl"):
        mi.load_dictionary(d)
    (d / "config.yaml").write_text("model_kind: transcoder_set\ntranscoders: [transcoder.pkl]\n")
    with pytest.raises(mi.DictionaryError, match=r"config\.yaml: transcoder for layer 0 is a pickle file 'transcoder\.pkl'"):
        mi.load_dictionary(d)
    assert not marker.exists()


# -- fuzzing: every failure of config.yaml reading is an MIError --------------------------

_YAML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 40) | st.floats(allow_nan=False) | st.text(max_size=10)
    | st.sampled_from(["cross_layer_transcoder", "transcoder_set", "relu", "jump_relu", "topk",
                       "mlp.hook_in", "hook_resid_mid", "W_enc_0.safetensors", "x.pt"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["layer", "filepath", "id", "k"]), inner, max_size=3),
    max_leaves=6)


@st.composite
def _yaml_configs(draw: Any) -> Any:
    keys = ["model_kind", "feature_input_hook", "feature_output_hook", "transcoders",
            "activation", "k", "model_name"]
    if draw(st.integers(0, 3)) == 0:
        return draw(_YAML_VALUES)
    return {k: draw(_YAML_VALUES) for k in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True))}


@pytest.fixture(scope="module")
def clt_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _copy(tmp_path_factory.mktemp("fuzz"))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(_yaml_configs())
def test_fuzzed_config_yaml_loads_or_raises_an_mi_error(clt_copy: Path, cfg: Any) -> None:
    import yaml

    (clt_copy / "config.yaml").write_text(yaml.safe_dump(cfg))
    try:
        clt = mi.load_dictionary(clt_copy, format="circuit-tracer-clt")
    except mi.MIError:
        return
    x = torch.randn(clt.n_layers, 2, clt.d_model, generator=torch.Generator().manual_seed(0))
    assert clt.decode(clt.encode(x)).shape == x.shape
