"""`MIModel.from_pretrained(hub_id, revision=...)` selects a hub snapshot (Pythia's training steps).

Offline: an HF cache in a tmp dir (HF_HUB_CACHE, HF_HUB_OFFLINE=1) holds two revisions of one
tiny model with different weights, in the layout huggingface_hub writes (refs/<name> holding a
commit, snapshots/<commit>/files). Reference: transformers' logits of each revision's weights.
The loads run in a subprocess because huggingface_hub reads its cache location at import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import mi_core as mi
from tests.transformer.conftest import make_tiny

REPO = "acme/tiny-steps"
COMMITS = {"step1000": "1" * 40, "step2000": "2" * 40}


def _populate(cache: Path, revisions: dict[str, Path]) -> None:
    root = cache / f"models--{REPO.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    for rev, src in revisions.items():
        snap = root / "snapshots" / COMMITS[rev]
        snap.mkdir(parents=True)
        for f in src.iterdir():
            (snap / f.name).write_bytes(f.read_bytes())
        (root / "refs" / rev).write_text(COMMITS[rev])
    (root / "refs" / "main").write_text(COMMITS["step2000"])


def _run(code: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def two_revisions(tiny, tmp_path_factory):
    a = tiny("llama")
    b = make_tiny(tmp_path_factory.mktemp("rev_b"), "llama_b", "llama", {}, seed=7)
    cache = tmp_path_factory.mktemp("hf_cache")
    _populate(cache, {"step1000": a.path, "step2000": b.path})
    return cache, {"step1000": a.hf, "step2000": b.hf}


@pytest.mark.slow
def test_each_revision_loads_its_own_weights(two_revisions, make_ids, tmp_path):
    cache, hf = two_revisions
    ids = make_ids(2, 8, seed=3)
    out = tmp_path / "logits.safetensors"
    code = (
        "import torch, mi_core as mi\n"
        "from safetensors.torch import save_file\n"
        f"ids = torch.tensor({ids.tolist()})\n"
        "res = {}\n"
        "for rev in ('step1000', 'step2000'):\n"
        f"    m = mi.MIModel.from_pretrained({REPO!r}, revision=rev)\n"
        "    res[rev] = m.forward(ids).output.contiguous()\n"
        f"save_file(res, {str(out)!r})\n")
    proc = _run(code, cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = load_file(str(out))
    with torch.no_grad():
        ref = {rev: m(ids).logits for rev, m in hf.items()}
    for rev in COMMITS:  # F32 parity with transformers on that revision's weights: < 1e-4
        assert (got[rev] - ref[rev]).abs().max().item() < 1e-4, rev
    # the two revisions really differ, so loading the wrong one would fail above
    assert (ref["step1000"] - ref["step2000"]).abs().max().item() > 0.1


def test_unknown_revision_is_a_config_error_naming_it(two_revisions):
    cache, _ = two_revisions
    code = ("import mi_core as mi\n"
            "try:\n"
            f"    mi.MIModel.from_pretrained({REPO!r}, revision='step999')\n"
            "except mi.ConfigError as e:\n"
            "    print('ConfigError', 'step999' in str(e))\n")
    proc = _run(code, cache)
    assert proc.stdout.strip() == "ConfigError True", proc.stderr[-3000:]


def test_revision_for_a_local_directory_is_refused(tiny):
    with pytest.raises(mi.ConfigError, match="revision='step1000'.*local path"):
        mi.MIModel.from_pretrained(str(tiny("llama").path), revision="step1000")
