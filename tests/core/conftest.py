"""Core fixtures: a toy checkpoint served by the example third-party plugin (tests/example_plugin)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mi_core as mi

from tests.support.toy_checkpoint import write_toy_checkpoint


@pytest.fixture()
def toy_dir(tmp_path: Path) -> Path:
    write_toy_checkpoint(tmp_path / "toy")
    return tmp_path / "toy"


@pytest.fixture()
def toy_weights(toy_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(toy_dir / "model.safetensors"))


@pytest.fixture()
def toy_model(toy_dir: Path) -> mi.MIModel:
    return mi.MIModel.from_pretrained(toy_dir)


@pytest.fixture()
def ids() -> torch.Tensor:
    return torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])
