"""Safetensors helpers (single, sharded, truncated, mis-shaped) and hub-id resolution offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import mi_core as mi
from mi_core.loading import SafetensorsCheckpoint, looks_like_hub_id, resolve_source
from tests.support.toy_checkpoint import write_toy_checkpoint


def test_sharded_checkpoint_is_read_through_its_index(tmp_path: Path) -> None:
    a, b = {"x": torch.ones(2, 3)}, {"y": torch.zeros(4)}
    save_file(a, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(b, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}))
    ck = SafetensorsCheckpoint.from_directory(tmp_path)
    assert sorted(ck.names()) == ["x", "y"] and ck.shapes["x"] == (2, 3)
    assert torch.equal(ck.get("y", dtype=torch.float64), torch.zeros(4, dtype=torch.float64))


def test_missing_shard_is_named(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"x": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(mi.WeightLoadError, match="model-00001-of-00002.safetensors"):
        SafetensorsCheckpoint.from_directory(tmp_path)


def test_truncated_file_is_a_weight_load_error_naming_the_file(tmp_path: Path) -> None:
    p = tmp_path / "model.safetensors"
    save_file({"x": torch.ones(100)}, str(p))
    p.write_bytes(p.read_bytes()[:-50])
    with pytest.raises(mi.WeightLoadError, match=r"model\.safetensors: truncated"):
        SafetensorsCheckpoint([p])


def test_check_lists_every_missing_and_misshaped_tensor(tmp_path: Path) -> None:
    save_file({"a": torch.ones(2, 2), "b": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    ck = SafetensorsCheckpoint.from_directory(tmp_path)
    with pytest.raises(mi.WeightLoadError) as err:
        ck.check({"a": (2, 2), "b": (4,), "c": (1,), "d": (1,)})
    msg = str(err.value)
    assert "missing tensors: c, d" in msg and "b: [3] != expected [4]" in msg
    with pytest.raises(mi.WeightLoadError, match=r"tensor 'b' has shape \[3\], expected \[4\]"):
        ck.get("b", shape=(4,))


def test_toy_backend_reports_misshaped_weights(tmp_path: Path) -> None:
    d = tmp_path / "toy"
    write_toy_checkpoint(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["d_model"] = 9
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(mi.WeightLoadError, match=r"embed: \[11, 8\] != expected \[11, 9\]"):
        mi.MIModel.from_pretrained(d)


def test_missing_config_field_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    d = tmp_path / "toy"
    write_toy_checkpoint(d)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["n_layers"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(mi.ConfigError, match="'n_layers' is missing"):
        mi.MIModel.from_pretrained(d)


def test_source_that_is_neither_path_nor_hub_id_is_a_config_error() -> None:
    assert looks_like_hub_id("org/name") and looks_like_hub_id("org/name/layer_3/width_16k")
    assert not looks_like_hub_id("a//b")
    with pytest.raises(mi.ConfigError, match="neither an existing path nor a hub id"):
        resolve_source("./no/such/dir")


def _populate_hf_cache(cache: Path, repo: str, files: dict[str, bytes]) -> None:
    """The on-disk layout huggingface_hub itself writes: blobs are plain files here."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for name, data in files.items():
        (snap / name).write_bytes(data)


def test_hub_id_loads_offline_from_a_prepopulated_hf_cache(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_toy_checkpoint(src)
    cache = tmp_path / "hf"
    _populate_hf_cache(cache, "acme/toy", {p.name: p.read_bytes() for p in src.iterdir()})
    code = ("import mi_core as mi, torch; m = mi.MIModel.from_pretrained('acme/toy'); "
            "print(m.backend_name, m.num_layers, m.forward(torch.tensor([[1,2]])).output.shape)")
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "toy 3 torch.Size([1, 2, 11])"


def test_hub_id_missing_from_the_offline_cache_is_a_clear_error(tmp_path: Path) -> None:
    code = ("import mi_core as mi\n"
            "try:\n    mi.MIModel.from_pretrained('acme/absent')\n"
            "except mi.ConfigError as e:\n    print('ConfigError', 'acme/absent' in str(e))")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "ConfigError True", out.stderr


def test_hub_download_asks_only_for_the_files_a_model_needs(monkeypatch, tmp_path: Path) -> None:
    import huggingface_hub

    seen = {}

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, **kw):
        seen.update(repo_id=repo_id, allow_patterns=allow_patterns)
        write_toy_checkpoint(tmp_path / "snap")
        return str(tmp_path / "snap")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    model = mi.MIModel.from_pretrained("acme/toy")
    assert model.backend_name == "toy" and seen["repo_id"] == "acme/toy"
    pats = seen["allow_patterns"]
    assert {"config.json", "*.safetensors", "tokenizer.json"} <= set(pats)
    assert not any(p in ("*", "*.bin", "*.pt", "*.pth") for p in pats)  # never pickles


def test_hub_id_with_a_subfolder_fetches_and_returns_only_that_folder(monkeypatch, tmp_path: Path) -> None:
    import huggingface_hub

    seen = {}

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, **kw):
        seen.update(repo_id=repo_id, allow_patterns=allow_patterns)
        write_toy_checkpoint(tmp_path / "snap" / "models" / "toy")
        return str(tmp_path / "snap")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    model = mi.MIModel.from_pretrained("acme/zoo/models/toy")
    assert model.backend_name == "toy" and seen["repo_id"] == "acme/zoo"
    assert "models/toy/config.json" in seen["allow_patterns"]
    assert all(p.startswith("models/toy/") for p in seen["allow_patterns"])
    with pytest.raises(mi.ConfigError, match="has no folder 'models/absent'"):
        mi.MIModel.from_pretrained("acme/zoo/models/absent")
