"""Hooks never alias on plugin mixer layers (issue 20 x issue 23): at every hook point of the
tiny state-space families (the ``ssm.*`` / mixer points included), an in-place edit by a
callable equals returning the edited tensor, so it reaches no other point."""

from __future__ import annotations

import pytest
import torch

from tests.support.inplace import inplace_mismatches, one_torch_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_an_inplace_edit_at_any_point_of_a_mixer_family_equals_returning_it(ssm_model,
                                                                            family) -> None:
    model = ssm_model(family)
    ids = torch.randint(0, model.backend.vocab_size if hasattr(model.backend, "vocab_size")
                        else 64, (2, 6), generator=torch.Generator().manual_seed(1))
    assert any(".ssm." in str(p) for p in model.hook_points())  # the mixer points are covered
    bad = inplace_mismatches(model, ids)
    assert not bad, "\n".join(bad)
