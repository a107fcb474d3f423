"""Tiny Mamba / Falcon-Mamba / Mamba-2 checkpoints (tests/support/ssm_tiny.py), built once per
session, and our models of them (loaded through the plugins, as a user would)."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi

from tests.support.ssm_tiny import SSM_FAMILIES, TinySsm, make_tiny_ssm

_CACHE: dict[str, TinySsm] = {}
_MODELS: dict[str, mi.MIModel] = {}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models: one intra-op thread avoids thread-pool overhead on a loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_ssm(tmp_path_factory: pytest.TempPathFactory):
    """tiny_ssm(name) -> TinySsm, built once per session."""
    root = tmp_path_factory.mktemp("tiny_ssm")

    def get(name: str) -> TinySsm:
        if name not in _CACHE:
            _CACHE[name] = make_tiny_ssm(root, name)
        return _CACHE[name]

    return get


@pytest.fixture(scope="session")
def ssm_model(tiny_ssm):
    """ssm_model(name) -> our MIModel of that tiny checkpoint (loaded once)."""

    def get(name: str) -> mi.MIModel:
        if name not in _MODELS:
            _MODELS[name] = mi.MIModel.from_pretrained(tiny_ssm(name).path)
        return _MODELS[name]

    return get


@pytest.fixture(params=sorted(SSM_FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return request.param
