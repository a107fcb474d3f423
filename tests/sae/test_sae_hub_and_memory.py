"""Hub ids served offline from a pre-populated HF cache; sparse decode memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_sae import SaeConfig, SparseAutoencoder
from tests.support.sae_tiny_backend import write_saelens_sae


def _fake_cache(cache: Path, repo: str, sha: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """The HF hub cache layout: models--org--name/{refs/main, snapshots/<sha>/...}."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)
    snap = root / "snapshots" / sha
    snap.mkdir(parents=True)
    return snap


def test_hub_id_loads_offline_from_prepopulated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as C

    cache = tmp_path / "hub"
    snap = _fake_cache(cache, "someorg/tiny-sae")
    write_saelens_sae(snap, "blocks.2.hook_resid_post", 16, 32)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(C, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(C, "HF_HUB_OFFLINE", True)
    sae = mi.load_dictionary("someorg/tiny-sae")
    assert sae.format == "saelens" and str(sae.hook_point) == "blocks.2.hook_resid_post"
    local = mi.load_dictionary(snap)
    x = torch.randn(3, 16)
    torch.testing.assert_close(sae.encode(x), local.encode(x), atol=0, rtol=0)
    with pytest.raises(mi.DictionaryError, match="someorg/not-cached"):
        mi.load_dictionary("someorg/not-cached")


def test_sparse_decode_never_allocates_dense_tokens_by_d_sae() -> None:
    tokens, d_sae, d_in, k = 256, 65536, 16, 8
    cfg = SaeConfig(d_in=d_in, d_sae=d_sae, activation="topk", architecture="topk", k=k,
                    hook_point=mi.HookPoint.parse("blocks.0.hook_resid_post"))
    g = torch.Generator().manual_seed(0)
    w = {"W_enc": torch.randn(d_in, d_sae, generator=g), "W_dec": torch.randn(d_sae, d_in, generator=g),
         "b_enc": torch.zeros(d_sae), "b_dec": torch.randn(d_in, generator=g)}
    sae = SparseAutoencoder(cfg, w, format="test")
    sa = mi.SparseActivations(indices=torch.randint(0, d_sae, (tokens, k), generator=g),
                              values=torch.rand(tokens, k, generator=g), d_sae=d_sae)
    dense_bytes = tokens * d_sae * 4
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y = sae.decode(sa)
    biggest = max((e.cpu_memory_usage for e in prof.events()), default=0)
    assert biggest < dense_bytes // 16, f"decode allocated {biggest} bytes"
    torch.testing.assert_close(y, sa.to_dense() @ w["W_dec"] + w["b_dec"], atol=1e-4, rtol=1e-5)


def test_gemma_scope_subfolder_loads_offline_via_load_from_hub(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    import huggingface_hub.constants as C

    from mi_sae import load_from_hub

    cache = tmp_path / "hub"
    snap = _fake_cache(cache, "google/gemma-scope-2b-pt-res")
    sub = snap / "layer_4" / "width_16k" / "average_l0_71"
    sub.mkdir(parents=True)
    g = np.random.default_rng(0)
    np.savez(sub / "params.npz", **{k: g.standard_normal(s).astype(np.float32) for k, s in
                                     {"W_enc": (8, 16), "W_dec": (16, 8), "b_enc": (16,),
                                      "b_dec": (8,), "threshold": (16,)}.items()})
    monkeypatch.setattr(C, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(C, "HF_HUB_OFFLINE", True)
    sae = load_from_hub("google/gemma-scope-2b-pt-res", "layer_4/width_16k/average_l0_71")
    assert sae.format == "gemmascope" and str(sae.hook_point) == "blocks.4.hook_resid_post"
    with pytest.raises(mi.DictionaryError, match="layer_9"):
        load_from_hub("google/gemma-scope-2b-pt-res", "layer_9/width_16k/average_l0_71")
