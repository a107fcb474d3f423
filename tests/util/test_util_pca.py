"""PCA against scikit-learn's PCA (independent implementation), tolerance 1e-5."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mi_core as mi
from mi_core.serialize import from_json, to_json
from mi_core.util.pca import PcaResult, pca


def test_matches_sklearn():
    from sklearn.decomposition import PCA

    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 8, generator=g) @ torch.randn(8, 8, generator=g) + 3.0
    r = pca(x, 3)
    sk = PCA(n_components=3).fit(x.double().numpy())
    comps = sk.components_ * np.sign(sk.components_[np.arange(3), np.abs(sk.components_).argmax(1)])[:, None]
    np.testing.assert_allclose(r.components.numpy(), comps, atol=1e-5)
    np.testing.assert_allclose(r.explained_variance.numpy(), sk.explained_variance_, rtol=1e-5)
    np.testing.assert_allclose(r.explained_variance_ratio.numpy(), sk.explained_variance_ratio_, rtol=1e-5)
    np.testing.assert_allclose(r.project(x).abs().numpy(), np.abs(sk.transform(x.double().numpy())), atol=1e-4)


def test_full_rank_reconstruction_is_exact_and_round_trips():
    x = torch.randn(10, 4, dtype=torch.float64)
    r = pca(x, 4)
    torch.testing.assert_close(r.reconstruct(r.project(x)), x)
    assert float(r.explained_variance_ratio.sum()) == pytest.approx(1.0)
    back = from_json(to_json(r), PcaResult)
    torch.testing.assert_close(back.components, r.components.float(), check_dtype=False)


def test_bad_input():
    with pytest.raises(mi.MIError, match="k=5"):
        pca(torch.randn(4, 3), 5)
    with pytest.raises(mi.MIError, match=r"\[n, d\]"):
        pca(torch.randn(4), 1)
