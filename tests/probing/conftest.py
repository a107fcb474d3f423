"""Fixtures of the probing tests: a registered toy backend and the committed dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

import mi_core as mi
from mi_core import plugins

from tests.support.probing_toy import ToyBackend, ToyPlugin, save_toy

DATA = Path(__file__).parent / "data"


@pytest.fixture()
def toy_plugin() -> Iterator[None]:
    # per test: other tests may reset the plugin manager between ours
    plugins.register_plugin(ToyPlugin(), name="mi_probing_toy")
    yield
    plugins.unregister_plugin("mi_probing_toy")


@pytest.fixture()
def toy_model() -> mi.MIModel:
    return mi.MIModel(ToyBackend(), source="toy")


@pytest.fixture()
def toy_dir(tmp_path: Path, toy_plugin: None) -> Path:
    return save_toy(tmp_path / "toy")


@pytest.fixture(scope="session")
def sentiment_path() -> Path:
    return DATA / "sentiment.jsonl"
