"""Mistakes in ``mi_core.tl`` raise an mi-core error that is also the builtin TransformerLens
(3.9, installed as the reference) raises for the same call: ``hook.layer()`` outside the
blocks, a cache key that is not a name; and ``utils.get_corner`` of a FactoredMatrix returns
what TransformerLens 3 returns."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.tl import ActivationCache, FactoredMatrix, HookPoint, utils
from mi_core.tl.errors import TLHookIndexError, TLHookTypeError

tl = pytest.importorskip("transformer_lens")


def _raised(fn) -> type[BaseException]:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001  (which kind is what is measured)
        return type(exc)
    raise AssertionError("no error raised")


@pytest.mark.parametrize("name", ["hook_embed", "ln_final.hook_normalized", "blocks.x.hook_a",
                                  None])
def test_layer_of_a_point_outside_the_blocks_raises_transformerlens_kind(name) -> None:
    from transformer_lens.hook_points import HookPoint as TLHookPoint

    theirs, ours = TLHookPoint(), HookPoint()
    theirs.name = ours.name = name
    builtin = _raised(theirs.layer)  # IndexError for "hook_embed", ValueError for the others
    assert builtin in (IndexError, ValueError)
    with pytest.raises(builtin):
        ours.layer()
    with pytest.raises(mi.HookError):
        ours.layer()
    assert issubclass(TLHookIndexError, (mi.HookError, IndexError, ValueError))
    ours.name = theirs.name = "blocks.3.attn.hook_pattern"
    assert ours.layer() == theirs.layer() == 3


@pytest.mark.parametrize("key", [0, 1.5, None, (0,)])
def test_cache_key_that_is_not_a_name_raises_transformerlens_type_error(key) -> None:
    acts = {"hook_embed": torch.zeros(1, 2, 4)}
    theirs = tl.ActivationCache(dict(acts), model=None)
    ours = ActivationCache(dict(acts))
    assert _raised(lambda: theirs[key]) is TypeError
    with pytest.raises(TLHookTypeError) as err:
        ours[key]
    assert isinstance(err.value, TypeError) and isinstance(err.value, mi.HookError)
    assert key not in ours  # membership stays a plain False
    # a name that is not cached stays TransformerLens' KeyError
    assert _raised(lambda: theirs["hook_pos_embed"]) is KeyError
    with pytest.raises(KeyError):
        ours["hook_pos_embed"]


def test_get_corner_of_a_factored_matrix_is_transformerlens_3s() -> None:
    """TransformerLens 3 returns the corner as a FactoredMatrix (2.x returned its ``.AB``);
    tensors are unchanged, and the matrix's own ``get_corner`` is still the product's corner."""
    from transformer_lens import utils as tu

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 5, 4, generator=g), torch.randn(2, 4, 6, generator=g)
    ours, theirs = utils.get_corner(FactoredMatrix(a, b), 2), \
        tu.get_corner(tl.FactoredMatrix(a, b), 2)
    assert isinstance(ours, FactoredMatrix) and isinstance(theirs, tl.FactoredMatrix)
    assert ours.shape == theirs.shape == (2, 2, 2)
    torch.testing.assert_close(ours.AB, theirs.AB, rtol=0, atol=0)
    torch.testing.assert_close(FactoredMatrix(a, b).get_corner(2), (a @ b)[:2, :2, :2])
    x = torch.randn(4, 5, 6, generator=g)
    assert torch.equal(utils.get_corner(x), tu.get_corner(x))
