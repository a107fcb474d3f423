"""``mi_core.tl.FactoredMatrix`` against TransformerLens' ``FactoredMatrix`` on the same factors:
properties (eigenvalues, S, U, V), svd, indexing, products, repr; and TransformerLens'
composition scores. float64, to 1e-10 (the same operations in the same order)."""

from __future__ import annotations

import pytest
import torch

from mi_core.tl import FactoredMatrix, utils

pytest.importorskip("transformer_lens")


@pytest.fixture
def factors():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(3, 4, 20, 5, generator=g, dtype=torch.float64),
            torch.randn(3, 4, 5, 20, generator=g, dtype=torch.float64))


def _same(a, b) -> None:
    from transformer_lens import FactoredMatrix as TLFactoredMatrix

    if isinstance(b, TLFactoredMatrix):
        assert isinstance(a, FactoredMatrix) and a.shape == b.shape and a.mdim == b.mdim
        a, b = a.AB, b.AB
    assert a.shape == b.shape
    torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_factored_matrix_is_transformerlens(factors):
    from transformer_lens import FactoredMatrix as TLFactoredMatrix

    ours, theirs = FactoredMatrix(*factors), TLFactoredMatrix(*factors)
    assert repr(ours) == repr(theirs) and ours.shape == theirs.shape
    for name in ("eigenvalues", "S", "U", "V", "AB", "BA"):
        _same(getattr(ours, name), getattr(theirs, name))
    _same(ours.norm(), theirs.norm())
    for x, y in zip(ours.svd(), theirs.svd()):
        _same(x, y)
    for idx in (1, (1, 2), (1, 2, 3), (0, 1, slice(2, 5), 4), (-1, -1, 0, -1)):
        _same(ours[idx], theirs[idx])
    other = torch.randn(20, 7, dtype=torch.float64)
    _same(ours @ other, theirs @ other)
    _same(other.T @ ours, other.T @ theirs)
    _same(ours @ ours.T, theirs @ theirs.T)
    _same(ours.make_even(), theirs.make_even())
    _same(ours.get_corner(2), theirs.get_corner(2))
    _same(utils.composition_scores(ours, ours.T), 
          __import__("transformer_lens.utils", fromlist=["x"]).composition_scores(theirs,
                                                                                  theirs.T))
    with pytest.raises(AssertionError):
        FactoredMatrix(torch.zeros(3, 4), torch.zeros(5, 3))


def test_printing_eigenvalues_prints_a_tensor_not_a_method(factors):
    ev = FactoredMatrix(*factors).eigenvalues
    assert isinstance(ev, torch.Tensor) and ev.is_complex() and ev.shape == (3, 4, 5)
