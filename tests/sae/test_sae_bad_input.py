"""Bad input: typed errors that name the file, tensor, hook point and shapes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import mi_core as mi
from tests.support.bad_files import write_pickle_payload
from tests.support.sae_tiny_backend import tiny_model, write_saelens_sae


@pytest.fixture(scope="module")
def model() -> mi.MIModel:
    return tiny_model()


def test_d_in_not_matching_hook_width_names_hook_and_w_enc(model, tmp_path: Path) -> None:
    sae = mi.load_dictionary(write_saelens_sae(tmp_path, "blocks.0.hook_resid_post", 24, 32))
    with pytest.raises(mi.DictionaryError, match=r"blocks\.0\.hook_resid_post has width 16.*W_enc \[24, 32\]"):
        sae.splice(mi.HookSpec(), model=model)
    # without the pre-check, the intervention itself refuses (names file and hook)
    with pytest.raises(mi.DictionaryError, match=r"sae_weights\.safetensors.*width 16"):
        model(torch.zeros(1, 3, dtype=torch.long), sae.splice(mi.HookSpec()))


def test_hook_the_model_lacks_is_a_hook_error(model, tmp_path: Path) -> None:
    sae = mi.load_dictionary(write_saelens_sae(tmp_path, "blocks.7.hook_resid_post", 16, 32))
    with pytest.raises(mi.HookError, match=r"blocks\.7\.hook_resid_post.*valid layers are 0\.\.1"):
        sae.splice(mi.HookSpec(), model=model)
    with pytest.raises(mi.HookError, match="blocks.7.hook_resid_post"):
        model(torch.zeros(1, 3, dtype=torch.long), sae.splice(mi.HookSpec()))


def test_missing_tensor_names_file_and_tensor(tmp_path: Path) -> None:
    d = write_saelens_sae(tmp_path, "blocks.0.hook_resid_post", 16, 32)
    w = load_file(str(d / "sae_weights.safetensors"))
    del w["b_enc"]
    save_file(w, str(d / "sae_weights.safetensors"))
    with pytest.raises(mi.DictionaryError, match=r"sae_weights\.safetensors.*missing tensor 'b_enc'"):
        mi.load_dictionary(d)


def test_nan_in_weights_names_file_and_tensor(tmp_path: Path) -> None:
    d = write_saelens_sae(tmp_path, "blocks.0.hook_resid_post", 16, 32)
    w = load_file(str(d / "sae_weights.safetensors"))
    w["W_dec"][3, 2] = float("nan")
    save_file(w, str(d / "sae_weights.safetensors"))
    with pytest.raises(mi.DictionaryError, match=r"sae_weights\.safetensors(?=.*W_dec)(?=.*NaN)"):
        mi.load_dictionary(d)


def test_nan_in_gemma_scope_npz_names_tensor(tmp_path: Path) -> None:
    d = tmp_path / "gemma-scope-2b-pt-res" / "layer_1"
    d.mkdir(parents=True)
    a = {k: np.ones(s, np.float32) for k, s in
         {"W_enc": (4, 8), "W_dec": (8, 4), "b_enc": (8,), "b_dec": (4,), "threshold": (8,)}.items()}
    a["threshold"][0] = np.nan
    np.savez(d / "params.npz", **a)
    with pytest.raises(mi.DictionaryError, match=r"params\.npz.*'threshold' contains NaN"):
        mi.load_dictionary(d)


def test_pickled_npz_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "gemma-scope-2b-pt-res" / "layer_1"
    d.mkdir(parents=True)
    np.savez(d / "params.npz", W_enc=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(mi.DictionaryError, match="pickle"):
        mi.load_dictionary(d)


def test_unknown_architecture_lists_supported_ones(tmp_path: Path) -> None:
    d = write_saelens_sae(tmp_path, "blocks.0.hook_resid_post", 16, 32, arch="matching_pursuit")
    with pytest.raises(mi.DictionaryError, match=r"cfg\.json.*'matching_pursuit'.*standard, jumprelu"):
        mi.load_dictionary(d)


def test_mis_shaped_tensor_names_expected_shape(tmp_path: Path) -> None:
    d = write_saelens_sae(tmp_path, "blocks.0.hook_resid_post", 16, 32)
    cfg = json.loads((d / "cfg.json").read_text())
    cfg["d_sae"] = 30
    (d / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(mi.DictionaryError, match=r"'W_enc' has shape \[16, 32\], expected \[16, 30\]"):
        mi.load_dictionary(d)


def test_unrecognised_directory_says_what_each_format_looks_for(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(mi.DictionaryError, match=r"(?s)saelens.*cfg\.json.*sparsify.*sae\.safetensors"):
        mi.load_dictionary(tmp_path)


def test_encode_of_wrong_width_input_is_a_dictionary_error(tmp_path: Path) -> None:
    sae = mi.load_dictionary(write_saelens_sae(tmp_path, "blocks.0.hook_resid_post", 16, 32))
    with pytest.raises(mi.DictionaryError, match=r"input width 8.*d_in=16"):
        sae.encode(torch.zeros(3, 8))


# -- cfg.json: strict types, no coercion -------------------------------------------------

def _with_cfg(tmp_path: Path, **changes: Any) -> Path:
    """A valid SAELens folder whose cfg.json has `changes` (metadata keys under `metadata.`)."""
    d = write_saelens_sae(tmp_path / "sae", "blocks.0.hook_resid_post", 16, 32)
    cfg = json.loads((d / "cfg.json").read_text())
    for k, v in changes.items():
        if k.startswith("metadata."):
            cfg["metadata"][k.removeprefix("metadata.")] = v
        else:
            cfg[k] = v
    (d / "cfg.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("key, value", [
    ("d_in", "16"), ("d_sae", 32.5), ("d_sae", True), ("apply_b_dec_to_input", "false"),
    ("metadata", ["blocks.0.hook_resid_post"]), ("activation_fn_kwargs", "k=4"),
    ("metadata.hook_name", 42), ("normalize_activations", "whiten"),
    ("reshape_activations", "hook_q"), ("rescale_acts_by_decoder_norm", 1),
    ("architecture", ["topk"]), ("d_in", 0), ("metadata.hook_head_index", 3),
])
def test_saelens_cfg_value_of_wrong_type_or_range_names_file_key_and_value(
        tmp_path: Path, key: str, value: Any) -> None:
    d = _with_cfg(tmp_path, **{key: value})
    with pytest.raises(mi.DictionaryError) as err:
        mi.load_dictionary(d)
    msg = str(err.value)
    name = key.removeprefix("metadata.")
    assert "cfg.json" in msg and f"'{name}'" in msg and repr(value) in msg, msg


def test_topk_k_of_wrong_type_inside_activation_fn_kwargs_is_named(tmp_path: Path) -> None:
    d = _with_cfg(tmp_path, architecture="standard", activation_fn="topk",
                  activation_fn_kwargs={"k": "8"})
    with pytest.raises(mi.DictionaryError, match=r"cfg\.json \(activation_fn_kwargs\): key 'k' = '8'"):
        mi.load_dictionary(d)


@pytest.mark.parametrize("text, why", [("[1, 2]", "JSON object"), ("{'d_in': 16", "not valid JSON")])
def test_cfg_json_of_wrong_json_shape_names_the_file(tmp_path: Path, text: str, why: str) -> None:
    d = write_saelens_sae(tmp_path / "sae", "blocks.0.hook_resid_post", 16, 32)
    (d / "cfg.json").write_text(text)
    with pytest.raises(mi.DictionaryError, match=rf"cfg\.json.*{why}"):
        mi.load_dictionary(d)


# -- weights -----------------------------------------------------------------------------

def _edit_weights(tmp_path: Path, edit: Any) -> Path:
    d = write_saelens_sae(tmp_path / "sae", "blocks.0.hook_resid_post", 16, 32)
    w = load_file(str(d / "sae_weights.safetensors"))
    edit(w)
    save_file(w, str(d / "sae_weights.safetensors"))
    return d


def test_unknown_tensor_in_saelens_file_is_named(tmp_path: Path) -> None:
    d = _edit_weights(tmp_path, lambda w: w.update(W_dec_bias_extra=torch.zeros(16)))
    with pytest.raises(mi.DictionaryError, match=r"sae_weights\.safetensors: unknown tensor\(s\) W_dec_bias_extra"):
        mi.load_dictionary(d)


def test_integer_tensor_is_refused_by_name(tmp_path: Path) -> None:
    d = _edit_weights(tmp_path, lambda w: w.update(b_enc=torch.zeros(32, dtype=torch.int32)))
    with pytest.raises(mi.DictionaryError, match=r"sae_weights\.safetensors(?=.*b_enc)(?=.*int)"):
        mi.load_dictionary(d)


def test_inf_in_encoder_names_the_tensor(tmp_path: Path) -> None:
    def poison(w: dict[str, torch.Tensor]) -> None:
        w["W_enc"][0, 0] = float("inf")

    with pytest.raises(mi.DictionaryError, match=r"sae_weights\.safetensors(?=.*W_enc)(?=.*inf)"):
        mi.load_dictionary(_edit_weights(tmp_path, poison))


def test_transcoder_decoder_of_wrong_shape_names_both_shapes(tmp_path: Path) -> None:
    d = write_saelens_sae(tmp_path / "tc", "blocks.0.ln2.hook_normalized", 16, 32, arch="transcoder",
                          hook_out="blocks.0.hook_mlp_out", d_out=16)
    w = load_file(str(d / "sae_weights.safetensors"))
    w["b_dec"] = torch.zeros(12)
    save_file(w, str(d / "sae_weights.safetensors"))
    with pytest.raises(mi.DictionaryError, match=r"'b_dec' has shape \[12\], expected \[16\]"):
        mi.load_dictionary(d)


def test_decoder_norm_rescaling_with_a_zero_decoder_row_is_refused(tmp_path: Path) -> None:
    d = write_saelens_sae(tmp_path / "sae", "blocks.0.hook_resid_post", 16, 32, arch="topk",
                          extra={"k": 4, "rescale_acts_by_decoder_norm": True})
    w = load_file(str(d / "sae_weights.safetensors"))
    w["W_dec"][5] = 0.0  # a dead feature: would be 0 / 0 = NaN in every decode
    save_file(w, str(d / "sae_weights.safetensors"))
    with pytest.raises(mi.DictionaryError, match=r"sae_weights\.safetensors: rescale_acts_by_decoder_norm.*rows \[5\] are zero"):
        mi.load_dictionary(d)


# -- pickles: refused without unpickling -------------------------------------------------

@pytest.mark.parametrize("name", ["sae_weights.pt", "sae_weights.pth", "params.pkl", "pytorch_model.bin"])
def test_pickle_weights_are_refused_by_name_and_never_unpickled(tmp_path: Path, name: str) -> None:
    d = write_saelens_sae(tmp_path / "sae", "blocks.0.hook_resid_post", 16, 32)
    (d / "sae_weights.safetensors").unlink()
    marker = tmp_path / "unpickled"
    write_pickle_payload(d / name, marker)
    with pytest.raises(mi.DictionaryError, match=rf"refusing pickle file\(s\) {name.replace('.', chr(92) + '.')}"):
        mi.load_dictionary(d)
    with pytest.raises(mi.DictionaryError, match=rf"{name.replace('.', chr(92) + '.')}"):
        mi.load_dictionary(d / name)
    with pytest.raises(mi.DictionaryError, match="sae_weights.safetensors not found"):
        mi.load_dictionary(d, format="saelens")
    assert not marker.exists()


# -- other formats' configs ----------------------------------------------------------------

def test_llama_scope_hyperparams_of_wrong_type_are_named(tmp_path: Path) -> None:
    d = tmp_path / "ls"
    (d / "checkpoints").mkdir(parents=True)
    save_file({"encoder.weight": torch.zeros(8, 4), "encoder.bias": torch.zeros(8),
               "decoder.weight": torch.zeros(4, 8), "decoder.bias": torch.zeros(4)},
              str(d / "checkpoints" / "final.safetensors"))
    good = {"d_model": 4, "d_sae": 8, "jump_relu_threshold": 0.5, "hook_point_in": "blocks.0.hook_resid_post",
            "norm_activation": "dataset-wise", "dataset_average_activation_norm": {"in": 2.0, "out": 2.0}}
    (d / "hyperparams.json").write_text(json.dumps(good))
    assert mi.load_dictionary(d).d_sae == 8
    for key, value, pattern in [("d_model", "4", r"key 'd_model' = '4'"),
                                ("jump_relu_threshold", "0.5", r"key 'jump_relu_threshold' = '0\.5'"),
                                ("dataset_average_activation_norm", {"in": 0}, r"key 'in' = 0"),
                                ("hook_point_in", None, r"required field 'hook_point_in'"),
                                ("norm_activation", "token-wise", r"key 'norm_activation' = 'token-wise'")]:
        (d / "hyperparams.json").write_text(json.dumps(good | {key: value}))
        with pytest.raises(mi.DictionaryError, match=rf"hyperparams\.json.*{pattern}"):
            mi.load_dictionary(d)


def test_sparsify_cfg_of_wrong_type_is_named(tmp_path: Path) -> None:
    d = tmp_path / "layers.0"
    d.mkdir()
    save_file({"encoder.weight": torch.zeros(8, 4), "encoder.bias": torch.zeros(8),
               "W_dec": torch.zeros(8, 4), "b_dec": torch.zeros(4)}, str(d / "sae.safetensors"))
    good = {"d_in": 4, "num_latents": 8, "k": 2, "activation": "topk"}
    (d / "cfg.json").write_text(json.dumps(good))
    assert mi.load_dictionary(d).d_sae == 8
    for key, value in [("k", "2"), ("activation", "relu"), ("transcode", "no"), ("d_in", 4.0)]:
        (d / "cfg.json").write_text(json.dumps(good | {key: value}))
        with pytest.raises(mi.DictionaryError, match=rf"cfg\.json: key '{key}' = {re.escape(repr(value))}"):
            mi.load_dictionary(d)


def test_gemma_scope_2_hook_point_of_wrong_type_is_named(tmp_path: Path) -> None:
    d = tmp_path / "gs2" / "layer_1"
    d.mkdir(parents=True)
    save_file({"w_enc": torch.zeros(4, 8), "w_dec": torch.zeros(8, 4), "b_enc": torch.zeros(8),
               "b_dec": torch.zeros(4), "threshold": torch.zeros(8)}, str(d / "params.safetensors"))
    (d / "config.json").write_text(json.dumps({"architecture": "jump_relu", "hf_hook_point_in": 7}))
    with pytest.raises(mi.DictionaryError, match=r"config\.json: key 'hf_hook_point_in' = 7"):
        mi.load_dictionary(d)
    (d / "config.json").write_text(json.dumps({"architecture": "top_k"}))
    with pytest.raises(mi.DictionaryError, match=r"config\.json: key 'architecture' = 'top_k'"):
        mi.load_dictionary(d)


# -- fuzzing: every failure of cfg.json parsing is an MIError ------------------------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 70) | st.floats(allow_nan=True)
                     | st.text(max_size=12),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=6)
_KEYS = ["architecture", "d_in", "d_sae", "d_out", "k", "activation_fn", "activation_fn_str",
         "activation_fn_kwargs", "apply_b_dec_to_input", "normalize_activations",
         "rescale_acts_by_decoder_norm", "reshape_activations", "hook_name", "hook_point",
         "hook_name_out", "hook_head_index", "metadata"]
_VALUES = {"architecture": st.sampled_from(["standard", "jumprelu", "topk", "gated", "transcoder",
                                            "skip_transcoder", "nope"]),
           "hook_name": st.sampled_from(["blocks.0.hook_resid_post", "blocks.1.attn.hook_z", "x", ""]),
           "activation_fn": st.sampled_from(["relu", "topk", "gelu"])}


@st.composite
def _cfgs(draw: Any) -> Any:
    """Any JSON value (a third), else a valid config with 0-3 keys set to random JSON."""
    if draw(st.integers(0, 2)) == 0:
        return draw(_JSON)
    cfg: dict[str, Any] = {
        "architecture": draw(_VALUES["architecture"]), "d_in": draw(st.integers(1, 8)),
        "d_sae": draw(st.integers(1, 8)), "k": draw(st.integers(1, 8)),
        "apply_b_dec_to_input": draw(st.booleans()),
        "normalize_activations": draw(st.sampled_from(["none", "layer_norm", "constant_norm_rescale"])),
        "metadata": {"hook_name": draw(_VALUES["hook_name"])}}
    for k in draw(st.lists(st.sampled_from(_KEYS), max_size=3, unique=True)):
        cfg[k] = draw(_VALUES.get(k, _JSON) | _JSON)
    return cfg


@pytest.mark.filterwarnings("error")  # a warning (e.g. NaN-producing std) is a failure too
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cfgs())
def test_fuzzed_saelens_cfg_json_parses_or_raises_an_mi_error(raw: Any) -> None:
    from mi_sae.formats.saelens import parse_config
    from mi_sae.sae import SparseAutoencoder

    try:
        cfg = parse_config(raw, Path("fuzz/cfg.json"), {})
        # A config that parses must build an SAE (or refuse it typed) and encode.
        g = torch.Generator().manual_seed(0)
        w = {"W_enc": torch.randn(cfg.d_in, cfg.d_sae, generator=g),
             "W_dec": torch.randn(cfg.d_sae, cfg.out_dim, generator=g),
             "b_enc": torch.zeros(cfg.d_sae), "b_dec": torch.zeros(cfg.out_dim),
             "threshold": torch.zeros(cfg.d_sae), "b_gate": torch.zeros(cfg.d_sae),
             "b_mag": torch.zeros(cfg.d_sae), "r_mag": torch.zeros(cfg.d_sae)}
        sae = SparseAutoencoder(cfg, w, format="saelens", source="fuzz")
        x = torch.randn(2, cfg.d_in, generator=torch.Generator().manual_seed(0))
        assert bool(torch.isfinite(sae.reconstruct(x)).all())  # a loaded SAE gives numbers
    except mi.MIError:
        pass
