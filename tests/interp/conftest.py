"""Fixtures for the analysis tests: a tiny fake backend (no plugin needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.fake_backend import fake_model  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return fake_model(seed=0)


@pytest.fixture(scope="module")
def rwkv_like():
    """A model with only embed / resid_pre / resid_post / final-norm points (like RWKV)."""
    return fake_model(seed=1, rwkv_like=True)
