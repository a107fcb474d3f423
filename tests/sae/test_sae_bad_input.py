"""Bad input: typed errors that name the file, tensor, hook point and shapes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import mi_core as mi
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
    with pytest.raises(mi.DictionaryError, match=r"sae_weights\.safetensors.*'W_dec' contains NaN"):
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
