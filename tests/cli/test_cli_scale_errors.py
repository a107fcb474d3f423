"""``mi sweep`` and ``mi cache-activations`` turn every store problem into ``mi: error:``
naming the culprit (exit 1, no traceback): planted links, a store path that is a file, a
manifest that is not one, a damaged shard, a float16 overflow. On the toy checkpoint of the
example plugin (with its word-level tokenizer): no forward of a real model is needed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors.torch import save_file

from mi_cli.main import main
from tests.support.toy_checkpoint import write_toy_checkpoint

MARK = b"outside: must stay as it is\n"
TEXT = "the cat sat on a mat and dog ran far\n" * 3


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("toy") / "toy"
    write_toy_checkpoint(d, tokenizer=True)
    return d


@pytest.fixture()
def marker(tmp_path: Path) -> Path:
    p = tmp_path / "outside.txt"
    p.write_bytes(MARK)
    return p


def fails(capsys: pytest.CaptureFixture[str], argv: list[str], *culprits: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 1 and "\nmi: error: " in "\n" + err and "Traceback" not in err, err
    for c in culprits:
        assert c in err, err
    return err


def sweep_argv(tmp_path: Path, toy: Path, out: Path) -> list[str]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "the cat sat on", "answer": " a"}) + "\n")
    return ["sweep", str(prompts), "--analysis", "logit-lens", "--out", str(out), "--model",
            str(toy), "--no-progress", "-q"]


def cache_argv(tmp_path: Path, toy: Path, out: Path, *extra: str) -> list[str]:
    texts = tmp_path / "t.txt"
    texts.write_text(TEXT)
    return ["cache-activations", str(texts), "--hooks", "blocks.1.hook_resid_post", "--out",
            str(out), "--model", str(toy), "--context-len", "4", "--tokens-per-shard", "8",
            "--no-progress", "-q", *extra]


def test_sweep_cli_refuses_planted_links_and_bad_stores(toy, tmp_path, marker, capsys):
    out = tmp_path / "o"
    argv = sweep_argv(tmp_path, toy, out)
    assert main(argv) == 0
    capsys.readouterr()
    os.symlink(marker, out / "store" / ".lock.tmp")  # not a store name: ignored
    (out / "results.json").unlink()
    os.symlink(marker, out / "results.json")
    fails(capsys, argv, "results.json is a symbolic link")
    (out / "results.json").unlink()
    (out / "store" / ".lock").unlink()
    os.symlink(tmp_path / "elsewhere", out / "store" / ".lock")
    fails(capsys, argv, "store/.lock is a symbolic link")
    (out / "store" / ".lock").unlink()
    (out / "store" / "manifest.json").write_text("[1, 2]")
    fails(capsys, argv, "store/manifest.json: not a sweep store manifest")
    as_file = tmp_path / "file"
    as_file.write_text("x")
    fails(capsys, sweep_argv(tmp_path, toy, as_file), "file is a regular file")
    assert marker.read_bytes() == MARK and not (tmp_path / "elsewhere").exists()


def test_cache_cli_refuses_planted_links_and_damaged_shards(toy, tmp_path, marker, capsys):
    out = tmp_path / "acts"
    argv = cache_argv(tmp_path, toy, out)
    assert main(argv) == 0
    capsys.readouterr()
    shard = out / "shard-00001.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-7])
    fails(capsys, argv, "shard-00001.safetensors (shard 1): size", "truncated")
    shard.unlink()
    os.symlink(marker, shard)
    fails(capsys, argv, "shard-00001.safetensors is a symbolic link")
    shard.unlink()
    os.symlink(marker, out / "shard-00001.safetensors.tmp")
    fails(capsys, argv, "shard-00001.safetensors.tmp is a symbolic link")
    (out / "shard-00001.safetensors.tmp").unlink()
    man = json.loads((out / "manifest.json").read_text())
    del man["hooks"]
    (out / "manifest.json").write_text(json.dumps(man))
    fails(capsys, argv, "manifest.json: hooks: expected an object")
    assert marker.read_bytes() == MARK


def test_cache_cli_float16_overflow_names_the_hook_and_the_shard(toy, tmp_path, capsys):
    big = tmp_path / "big"
    weights = write_toy_checkpoint(big, tokenizer=True)
    save_file({**weights, "embed": weights["embed"] * 1e5}, str(big / "model.safetensors"))
    fails(capsys, cache_argv(tmp_path, big, tmp_path / "acts", "--dtype", "float16"),
          "shard-00000.safetensors", "'blocks.1.hook_resid_post'", "overflow the store's dtype "
          "float16")
