"""Fixtures: tiny random RWKV-6 / RWKV-7 checkpoints (2 layers, hidden 128, head size 64)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support import rwkv_ckpt  # noqa: E402

import mi_core as mi  # noqa: E402

from tests.support.rwkv_ckpt import HEAD, HIDDEN, LAYERS, VOCAB  # noqa: E402


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """These models are tiny: one intra-op thread avoids thread-pool overhead (which dominates
    on a loaded 2-core machine). Restored after each test."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def v6_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("rwkv6")
    return rwkv_ckpt.write_checkpoint(d, rwkv_ckpt.v6_tensors(LAYERS, HIDDEN, HEAD, VOCAB),
                                      rwkv_ckpt.v6_config(LAYERS, HIDDEN, HEAD, VOCAB))


@pytest.fixture(scope="session")
def v7_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("rwkv7")
    return rwkv_ckpt.write_checkpoint(d, rwkv_ckpt.v7_tensors(LAYERS, HIDDEN, HEAD, VOCAB),
                                      rwkv_ckpt.v7_config(LAYERS, HIDDEN, HEAD, VOCAB))


@pytest.fixture(scope="session")
def v6_model(v6_dir: Path) -> mi.MIModel:
    return mi.MIModel.from_pretrained(v6_dir)


@pytest.fixture(scope="session")
def v7_model(v7_dir: Path) -> mi.MIModel:
    return mi.MIModel.from_pretrained(v7_dir)


@pytest.fixture(params=["v6", "v7"])
def model(request: pytest.FixtureRequest) -> mi.MIModel:
    return request.getfixturevalue(f"{request.param}_model")


@pytest.fixture(scope="session")
def world_vocab() -> Path:
    """The real World vocabulary file shipped inside the `rwkv` package."""
    import importlib.util

    spec = importlib.util.find_spec("rwkv")
    assert spec is not None and spec.submodule_search_locations
    return Path(list(spec.submodule_search_locations)[0]) / "rwkv_vocab_v20230424.txt"
