"""mi_sae.store.store_metrics: SAE metrics on an activation store equal activation_metrics on
a direct capture of the same tokens (tolerance 1e-6: the same float32 computation)."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_sae import activation_metrics
from mi_sae.store import store_metrics
from tests.support.sae_tiny_backend import tiny_model, write_saelens_sae


def test_store_metrics_equal_metrics_on_a_direct_capture(tmp_path):
    model = tiny_model()
    hook = "blocks.0.hook_resid_post"
    sae = mi.load_dictionary(write_saelens_sae(tmp_path / "sae", hook, 16, 64))
    rows = torch.randint(0, 32, (6, 9), generator=torch.Generator().manual_seed(0))
    store = mi.cache_activations(model, rows, [hook], tmp_path / "acts", context_len=9,
                                 batch_size=6, verbose=False)
    got = store_metrics(sae, store, max_tokens=40)
    x = model.forward(rows, mi.HookSpec().capture(hook))[hook].reshape(-1, 16)[:40]
    ref = activation_metrics(sae, x)
    assert got.n_tokens == 40
    assert got.mse == pytest.approx(ref.mse, abs=1e-6)
    assert got.explained_variance == pytest.approx(ref.explained_variance, abs=1e-6)
    assert got.l0 == ref.l0
