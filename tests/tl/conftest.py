"""Fixtures of the TransformerLens layer's tests: checkpoints with a tokenizer (SmolLM2's first
layers, a GPT-2-shaped tiny model) and TransformerLens' models of them."""

from __future__ import annotations

import pytest

from tests.support.tl_demo_models import tl_checkpoints, tl_model  # noqa: F401  (fixture)

pytest.importorskip("transformer_lens")


@pytest.fixture(scope="module")
def tl_ref(tl_checkpoints):  # noqa: F811
    """name -> TransformerLens' HookedTransformer of that checkpoint (its defaults), built once
    per module."""
    built: dict = {}

    def get(name: str):
        if name not in built:
            built[name] = tl_model(tl_checkpoints[name])
        from tests.support.tl_demo_models import reset_tl
        reset_tl(built[name])
        return built[name]

    return get


@pytest.fixture(scope="module")
def pair(tl_checkpoints, tl_ref):  # noqa: F811
    """name -> (ours, TransformerLens'), both with TransformerLens' from_pretrained defaults
    and, at every call, back to their state after loading (hooks, switches)."""
    from mi_core.tl import HookedTransformer
    from tests.support.tl_demo_models import reset_tl

    ours: dict = {}

    def get(name: str):
        if name not in ours:
            ours[name] = HookedTransformer.from_pretrained(tl_checkpoints[name])
        reset_tl(ours[name])
        return ours[name], tl_ref(name)

    return get
