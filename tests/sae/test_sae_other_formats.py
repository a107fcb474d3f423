"""Gemma Scope 1/2, EleutherAI sparsify and Llama Scope files, against their references.

Gemma Scope and Llama Scope: the JumpReLU formula and SAELens' own pretrained loaders
(their hub downloads redirected to the local files); sparsify: the eai-sparsify package's
own encode / decode on files its save_to_disk wrote. Tolerance 1e-5 abs (F32).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import mi_core as mi
from mi_core.loading import safetensors_header

TOL = 1e-5
D_IN, D_SAE = 16, 64


def _rand(*shape: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32)


def _gs_arrays(d_out: int = D_IN) -> dict[str, np.ndarray]:
    return {"W_enc": _rand(D_IN, D_SAE, seed=1), "W_dec": _rand(D_SAE, d_out, seed=2),
            "b_enc": _rand(D_SAE, seed=3), "b_dec": _rand(d_out, seed=4),
            "threshold": np.abs(_rand(D_SAE, seed=5))}


def _jumprelu(x: torch.Tensor, a: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gemma Scope tutorial's JumpReLU: f = relu(h) * (h > threshold), no b_dec on input."""
    t = {k.replace("w_", "W_"): torch.from_numpy(v) for k, v in a.items()}
    h = x @ t["W_enc"] + t["b_enc"]
    f = torch.relu(h) * (h > t["threshold"])
    return f, f @ t["W_dec"] + t["b_dec"]


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Route SAELens' hub calls to files under tmp_path/<repo_id>/."""
    from huggingface_hub.utils import EntryNotFoundError
    from sae_lens.loading import pretrained_sae_loaders as L

    def download(repo_id: str, filename: str, subfolder: str | None = None, **_: object) -> str:
        p = tmp_path / repo_id / (subfolder or "") / filename
        if not p.exists():
            raise EntryNotFoundError(str(p))
        return str(p)

    def shapes(repo_id: str, filename: str) -> dict[str, list[int]]:
        h = safetensors_header(tmp_path / repo_id / filename)
        return {k: v["shape"] for k, v in h.items() if k != "__metadata__"}

    monkeypatch.setattr(L, "hf_hub_download", download)
    monkeypatch.setattr(L, "get_safetensors_tensor_shapes", shapes)
    return tmp_path


def _sae_lens_from(cfg: dict, state: dict[str, torch.Tensor]):
    from sae_lens.loading.pretrained_sae_loaders import handle_config_defaulting
    from sae_lens.saes import SAE

    sae = SAE.from_dict(handle_config_defaulting(cfg))
    sae.load_state_dict(state)
    return sae


@pytest.mark.parametrize("lowercase", [False, True])
def test_gemma_scope_1_npz_matches_jumprelu_formula_and_sae_lens_loader(
        fake_hub: Path, lowercase: bool) -> None:
    from sae_lens.loading.pretrained_sae_loaders import gemma_2_sae_huggingface_loader

    repo, folder = "google/gemma-scope-2b-pt-res", "layer_3/width_16k/average_l0_50"
    d = fake_hub / repo / folder
    d.mkdir(parents=True)
    a = _gs_arrays()
    if lowercase:
        a = {k.replace("W_", "w_"): v for k, v in a.items()}
    np.savez(d / "params.npz", **a)
    ours = mi.load_dictionary(d)
    assert ours.format == "gemmascope" and str(ours.hook_point) == "blocks.3.hook_resid_post"
    x = torch.randn(2, 5, D_IN) * 2
    f_ref, out_ref = _jumprelu(x, a)
    assert (f_ref != 0).any() and (f_ref == 0).any()
    torch.testing.assert_close(ours.encode(x), f_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.reconstruct(x), out_ref, atol=TOL, rtol=0)
    cfg, state, _ = gemma_2_sae_huggingface_loader(repo, folder, cfg_overrides={"d_in": D_IN, "d_sae": D_SAE})
    ref = _sae_lens_from(cfg, state)
    with torch.no_grad():
        torch.testing.assert_close(ours.encode(x), ref.encode(x), atol=TOL, rtol=0)
        torch.testing.assert_close(ours.reconstruct(x), ref.decode(ref.encode(x)), atol=TOL, rtol=0)


@pytest.mark.parametrize("transcoder", [False, True])
def test_gemma_scope_2_safetensors_match_sae_lens_loader(fake_hub: Path, transcoder: bool) -> None:
    from sae_lens.loading.pretrained_sae_loaders import gemma_3_sae_huggingface_loader

    repo = "google/gemma-scope-2-270m-pt"
    d_out = 12 if transcoder else D_IN
    a = {k.lower(): v for k, v in _gs_arrays(d_out).items()}
    if transcoder:
        folder = "transcoder/layer_3_width_16k_l0_small_affine"
        a["affine_skip_connection"] = _rand(D_IN, d_out, seed=9)  # stored [d_in, d_out]
        cfg = {"architecture": "jump_relu", "model_name": "gemma-v3-270m-pt", "affine_connection": True,
               "hf_hook_point_in": "model.layers.3.pre_feedforward_layernorm.output",
               "hf_hook_point_out": "model.layers.3.post_feedforward_layernorm.output"}
    else:
        folder = "resid_post/layer_3_width_16k_l0_small"
        cfg = {"architecture": "jump_relu", "model_name": "gemma-v3-270m-pt",
               "hf_hook_point_in": "model.layers.3.output"}
    d = fake_hub / repo / folder
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    save_file({k: torch.from_numpy(v) for k, v in a.items()}, str(d / "params.safetensors"))
    ours = mi.load_dictionary(d)
    x = torch.randn(2, 5, D_IN) * 2
    ref_cfg, state, _ = gemma_3_sae_huggingface_loader(repo, folder)
    ref = _sae_lens_from(ref_cfg, state)
    with torch.no_grad():
        f_ref = ref.encode(x)
        out_ref = ref.forward(x)  # skip transcoders add x @ W_skip.T here
    torch.testing.assert_close(ours.encode(x), f_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.reconstruct(x), out_ref, atol=TOL, rtol=0)
    if transcoder:
        assert ours.architecture == "jumprelu_skip_transcoder"
        # trained on pre_feedforward_layernorm.output: the MLP's input after the norm's gain
        # (sae-lens names it TransformerLens' hook_mlp_in, the residual before the norm)
        assert (str(ours.hook_point), str(ours.hook_point_out)) == (
            "blocks.3.mlp.hook_in", "blocks.3.hook_mlp_out")
        skip = torch.from_numpy(a["affine_skip_connection"])
        torch.testing.assert_close(ours.reconstruct(x) - ours.decode(ours.encode(x)), x @ skip,
                                   atol=TOL, rtol=0)
    else:
        assert str(ours.hook_point) == "blocks.3.hook_resid_post"


def _sparsify_coder(tmp: Path, name: str, **cfg: object):
    sparsify = pytest.importorskip("sparsify")
    torch.manual_seed(0)
    coder = sparsify.SparseCoder(D_IN, sparsify.SparseCoderConfig(num_latents=D_SAE, **{"k": 6, **cfg}))
    with torch.no_grad():
        for p in coder.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    coder.save_to_disk(tmp / name)
    return coder


@pytest.mark.parametrize("variant", ["topk", "groupmax", "transcode_skip"])
def test_sparsify_matches_eai_sparsify_on_files_it_saved(tmp_path: Path, variant: str) -> None:
    cfg = {"topk": {}, "groupmax": {"activation": "groupmax", "k": 8},
           "transcode_skip": {"transcode": True, "skip_connection": True}}[variant]
    name = "layers.2.mlp" if variant == "transcode_skip" else "layers.2"
    coder = _sparsify_coder(tmp_path, name, **cfg)
    ours = mi.load_dictionary(tmp_path / name)
    assert ours.format == "sparsify"
    x = torch.randn(10, D_IN)
    with torch.no_grad():
        top_acts, top_idx, _ = coder.encode(x)
        f_ref = torch.zeros(10, D_SAE).scatter_(-1, top_idx, top_acts)
        out_ref = coder.forward(x).sae_out
        dec_ref = coder.decode(top_acts, top_idx)
    torch.testing.assert_close(ours.encode(x), f_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.reconstruct(x), out_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.decode(ours.encode_sparse(x)), dec_ref, atol=TOL, rtol=0)
    if variant == "transcode_skip":
        assert (str(ours.hook_point), str(ours.hook_point_out)) == (  # the MLP module's input
            "blocks.2.mlp.hook_in", "blocks.2.hook_mlp_out")
    else:
        assert str(ours.hook_point) == "blocks.2.hook_resid_post"


def test_sae_lens_own_sparsify_loader_transposes_w_dec_of_real_files(tmp_path: Path) -> None:
    """Why we read sparsify ourselves: sae-lens 6.54 turns W_dec [d_sae, d_in] into [d_in, d_sae]."""
    from sae_lens.loading.pretrained_sae_loaders import sparsify_disk_loader

    _sparsify_coder(tmp_path, "layers.2")
    _, state = sparsify_disk_loader(tmp_path / "layers.2")
    assert tuple(state["W_dec"].shape) == (D_IN, D_SAE)  # wrong: decoders are [d_sae, d_out]
    assert tuple(mi.load_dictionary(tmp_path / "layers.2").W_dec.shape) == (D_SAE, D_IN)


def test_llama_scope_matches_sae_lens_loader_with_norm_folding(fake_hub: Path) -> None:
    from sae_lens.loading.pretrained_sae_loaders import llama_scope_sae_huggingface_loader

    repo, folder = "fnlp/Llama3_1-8B-Base-LXR-8x", "Llama3_1-8B-Base-L5R-8x"
    d = fake_hub / repo / folder
    (d / "checkpoints").mkdir(parents=True)
    avg_norm = 7.0
    hp = {"d_model": D_IN, "d_sae": D_SAE, "hook_point_in": "blocks.5.hook_resid_post",
          "hook_point_out": "blocks.5.hook_resid_post", "jump_relu_threshold": 0.2,
          "act_fn": "jumprelu", "norm_activation": "dataset-wise",
          "dataset_average_activation_norm": {"in": avg_norm, "out": avg_norm}}
    (d / "hyperparams.json").write_text(json.dumps(hp))
    g = torch.Generator().manual_seed(0)
    w = {"encoder.weight": torch.randn(D_SAE, D_IN, generator=g) * 0.3,
         "encoder.bias": torch.randn(D_SAE, generator=g) * 0.3,
         "decoder.weight": torch.randn(D_IN, D_SAE, generator=g) * 0.3,
         "decoder.bias": torch.randn(D_IN, generator=g) * 0.3}
    save_file(w, str(d / "checkpoints" / "final.safetensors"))
    ours = mi.load_dictionary(d)
    assert ours.format == "llamascope" and str(ours.hook_point) == "blocks.5.hook_resid_post"
    cfg, state, _ = llama_scope_sae_huggingface_loader(repo, folder, cfg_overrides={"dtype": "float32"})
    ref = _sae_lens_from(cfg, state)
    # SAELens folds the dataset-wise norm factor (from its pretrained_saes.yaml) into the weights
    ref.fold_activation_norm_scaling_factor(math.sqrt(D_IN) / avg_norm)
    x = torch.randn(3, 4, D_IN) * avg_norm / math.sqrt(D_IN) * 3
    with torch.no_grad():
        f_ref = ref.encode(x)
        out_ref = ref.decode(f_ref)
    assert (f_ref != 0).any() and (f_ref == 0).any()
    torch.testing.assert_close(ours.encode(x), f_ref, atol=TOL, rtol=0)
    # outputs reach |30|: SAELens folds s into W_dec, we divide by s; F32 rounding, so 1e-6 rel
    torch.testing.assert_close(ours.reconstruct(x), out_ref, atol=TOL, rtol=1e-6)
    torch.testing.assert_close(ours.decode(ours.encode_sparse(x)), out_ref, atol=TOL, rtol=1e-6)
