"""The example's pipeline on the real SmolLM2-135M (GGUF): PCA SAE -> SAELens files -> load
-> splice. References: the un-spliced run (error term: logits equal to 1e-4) and the PCA
projection the SAE is built to compute. Two forward passes only (CPU time is scarce)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_sae import activation_metrics
from mi_sae.formats.saelens import save
sae_smollm2 = pytest.importorskip("sae_smollm2")


@pytest.mark.slow
def test_pca_sae_on_smollm2_round_trips_and_splices(smollm2, tmp_path: Path) -> None:
    if importlib.util.find_spec("mi_transformer") is None:
        pytest.skip("mi-transformer not installed")
    hook, m = mi.HookPoint.resid_post(3), 8
    ids = smollm2.to_tokens(sae_smollm2.TRAIN[0])
    clean = smollm2(ids, mi.HookSpec().capture(hook))
    acts = clean[hook][0]  # [seq, 576]
    built = sae_smollm2.pca_sae(acts, m, hook)
    sae = mi.load_dictionary(save(built, tmp_path))
    assert sae.format == "saelens" and sae.hook_point == hook and sae.d_sae == 2 * m
    torch.testing.assert_close(sae.reconstruct(acts), built.reconstruct(acts), atol=1e-5, rtol=0)
    # ReLU([V, -V]) keeps both signs, so decode(encode(x)) = mu + V V^T (x - mu): a projection
    mu, V = built.b_dec, built.W_enc[:, :m]
    torch.testing.assert_close(sae.reconstruct(acts), mu + (acts - mu) @ V @ V.T, atol=1e-3, rtol=1e-5)
    assert activation_metrics(sae, acts).explained_variance > 0.5
    with_err = smollm2(ids, sae.splice(mi.HookSpec(), include_error=True, model=smollm2)).output
    torch.testing.assert_close(with_err, clean.output, atol=1e-4, rtol=0)
