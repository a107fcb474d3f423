"""Stores are confined: every file a sweep store or an activation store reads or writes is
inside its directory and never reached through a link. Each attack plants something in a
store (a symbolic link to a marker file outside it, a hard link, a FIFO, a directory under a
file's name) and checks the typed error names the planted file and that nothing outside the
store was created, truncated or overwritten."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.scale import _fs
from tests.support.fake_backend import fake_model
from tests.support.sweep_fns import TOY_JOBS, toy_logits
from tests.support.toy_checkpoint import write_toy_checkpoint

HOOK = "blocks.0.hook_resid_post"
CTX = 8
MARK = b"outside the store: must stay as it is\n"


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("toy") / "toy"
    write_toy_checkpoint(d)
    return d


@pytest.fixture(scope="module")
def model() -> mi.MIModel:
    return fake_model(seed=0)


@pytest.fixture()
def marker(tmp_path: Path) -> Path:
    """A file outside every store; its content is checked after each attack."""
    p = tmp_path / "outside" / "marker.txt"
    p.parent.mkdir()
    p.write_bytes(MARK)
    return p


def rows() -> torch.Tensor:
    return torch.randint(1, 250, (6, CTX), generator=torch.Generator().manual_seed(0))


def cache(model: mi.MIModel, out: Path, **kw) -> mi.ActivationStore:
    return mi.cache_activations(model, rows(), [HOOK], out, context_len=CTX, batch_size=2,
                                tokens_per_shard=2 * CTX, verbose=False, **kw)


def intact(marker: Path) -> None:
    assert marker.read_bytes() == MARK
    assert sorted(p.name for p in marker.parent.iterdir()) == ["marker.txt"]


# -- sweep stores ---------------------------------------------------------------------------

def test_sweep_lock_link_is_refused_and_creates_nothing_outside(toy, tmp_path, marker):
    store = tmp_path / "s"
    store.mkdir()
    target = marker.parent / "created-by-lock"
    os.symlink(target, store / ".lock")
    with pytest.raises(mi.StoreError, match=r"s/\.lock is a symbolic link"):
        mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    assert not target.exists()
    intact(marker)


def test_sweep_manifest_tmp_link_is_refused_and_its_target_kept(toy, tmp_path, marker):
    store = tmp_path / "s"
    store.mkdir()
    os.symlink(marker, store / "manifest.json.tmp")
    with pytest.raises(mi.StoreError, match=r"manifest\.json\.tmp is a symbolic link"):
        mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    intact(marker)


def test_sweep_part_link_is_refused_on_resume_and_on_load(toy, tmp_path, marker):
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:3], model=toy, store=store)
    part = store / "part-00000.jsonl"
    part.unlink()
    os.symlink(marker, part)  # before: resuming truncated the "torn" target to its records
    for call in (lambda: mi.load_sweep(store),
                 lambda: mi.run_sweep(toy_logits, TOY_JOBS[:4], model=toy, store=store)):
        with pytest.raises(mi.StoreError, match=r"part-00000\.jsonl is a symbolic link"):
            call()
    intact(marker)


def test_sweep_next_part_name_planted_as_a_link_is_refused(toy, tmp_path, marker):
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    os.symlink(marker.parent / "new-part", store / "part-00001.jsonl")  # dangling
    with pytest.raises(mi.StoreError, match=r"part-00001\.jsonl is a symbolic link"):
        mi.run_sweep(toy_logits, TOY_JOBS[:4], model=toy, store=store)
    intact(marker)


def test_sweep_hard_linked_part_is_never_repaired_in_place(toy, tmp_path, marker):
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    part = store / "part-00000.jsonl"
    outside = marker.parent / "part-copy.jsonl"
    outside.write_bytes(part.read_bytes() + b'{"torn')  # a torn tail the writer would cut
    part.unlink()
    os.link(outside, part)
    before = outside.read_bytes()
    with pytest.raises(mi.StoreError, match=r"part-00000\.jsonl has 2 hard links"):
        mi.run_sweep(toy_logits, TOY_JOBS[:3], model=toy, store=store)
    assert outside.read_bytes() == before


def test_sweep_manifest_link_directory_fifo_are_typed_errors(toy, tmp_path, marker):
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    man = store / "manifest.json"
    saved = man.read_bytes()
    man.unlink()
    os.symlink(marker, man)
    with pytest.raises(mi.StoreError, match=r"manifest\.json is a symbolic link"):
        mi.load_sweep(store)
    man.unlink()
    man.mkdir()
    with pytest.raises(mi.StoreError, match=r"manifest\.json is a directory"):
        mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    man.rmdir()
    man.write_bytes(saved)
    part = store / "part-00000.jsonl"
    part.unlink()
    os.mkfifo(part)  # opening a FIFO for reading would block without O_NONBLOCK
    with pytest.raises(mi.StoreError, match=r"part-00000\.jsonl is a FIFO"):
        mi.load_sweep(store)
    part.unlink()
    part.mkdir()
    with pytest.raises(mi.StoreError, match=r"part-00000\.jsonl is a directory"):
        mi.load_sweep(store)
    intact(marker)


def test_sweep_store_path_that_is_a_file_or_a_link_is_refused(toy, tmp_path, marker):
    as_file = tmp_path / "file"
    as_file.write_text("x")
    with pytest.raises(mi.StoreError, match=r"file is a regular file, not a store directory"):
        mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=as_file)
    link = tmp_path / "link"
    os.symlink(marker.parent, link)
    with pytest.raises(mi.StoreError, match=r"link is a symbolic link .* pass the directory"):
        mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=link)
    with pytest.raises(mi.StoreError, match="no such store directory"):
        mi.load_sweep(tmp_path / "absent")
    intact(marker)
    assert as_file.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_sweep_read_only_store_is_a_typed_error_and_still_readable(toy, tmp_path):
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    (store / ".lock").unlink()
    store.chmod(0o555)
    try:
        with pytest.raises(mi.StoreError, match=r"\.lock: permission denied"):
            mi.run_sweep(toy_logits, TOY_JOBS[:3], model=toy, store=store)
        assert len(mi.load_sweep(store).results()) == 2
    finally:
        store.chmod(0o755)


def read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulate a read-only mount (the tests may run as root, which ignores permissions):
    what it refuses with EROFS, i.e. any write access and creating a file."""
    real = os.open

    def ro(path, flags, mode=0o777, *, dir_fd=None):
        exists = os.path.lexists(path) if dir_fd is None else _exists_at(path, dir_fd)
        if flags & (os.O_WRONLY | os.O_RDWR) or (flags & os.O_CREAT and not exists):
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(_fs.os, "open", ro)


def _exists_at(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def test_read_only_file_system_is_a_typed_error_naming_the_file(toy, model, tmp_path,
                                                                 monkeypatch):
    store, out = tmp_path / "s", tmp_path / "a"
    store.mkdir(), out.mkdir()
    read_only(monkeypatch)
    with pytest.raises(mi.StoreError, match=r"s/\.lock: the file system is read-only"):
        mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    with pytest.raises(mi.StoreError, match=r"a/\.lock: the file system is read-only"):
        cache(model, out)


def test_a_finished_store_on_a_read_only_file_system_is_read_and_rerun(toy, model, tmp_path,
                                                                        monkeypatch):
    store, out = tmp_path / "s", tmp_path / "a"
    done = mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store).results()
    cache(model, out)
    read_only(monkeypatch)
    assert mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store).results() == done
    assert mi.load_sweep(store).results() == done
    assert cache(model, out).report.shards_done_before == 3  # nothing to write: no write
    with pytest.raises(mi.StoreError, match=r"part-00001\.jsonl: the file system is read-only"):
        mi.run_sweep(toy_logits, TOY_JOBS[:3], model=toy, store=store)  # one more job


# -- activation stores ----------------------------------------------------------------------

def test_activation_lock_and_manifest_tmp_links_are_refused(model, tmp_path, marker):
    out = tmp_path / "a"
    out.mkdir()
    target = marker.parent / "created-by-lock"
    os.symlink(target, out / ".lock")
    with pytest.raises(mi.StoreError, match=r"a/\.lock is a symbolic link"):
        cache(model, out)
    (out / ".lock").unlink()
    os.symlink(marker, out / "manifest.json.tmp")
    with pytest.raises(mi.StoreError, match=r"manifest\.json\.tmp is a symbolic link"):
        cache(model, out)
    assert not target.exists()
    intact(marker)


def test_activation_shard_tmp_link_is_refused_and_its_target_kept(model, tmp_path, marker):
    out = tmp_path / "a"
    store = cache(model, out)
    store.shards[1].unlink()
    os.symlink(marker, out / "shard-00001.safetensors.tmp")  # before: truncated, then filled
    with pytest.raises(mi.StoreError, match=r"shard-00001\.safetensors\.tmp is a symbolic link"):
        cache(model, out)
    intact(marker)


def test_activation_shard_link_is_refused_when_read_and_on_resume(model, tmp_path, marker):
    out = tmp_path / "a"
    store = cache(model, out)
    outside = marker.parent / "shard.safetensors"
    genuine = store.shards[0].read_bytes()
    outside.write_bytes(genuine)  # a genuine shard, reached by a link
    store.shards[0].unlink()
    os.symlink(outside, store.shards[0])
    with pytest.raises(mi.StoreError, match=r"shard-00000\.safetensors is a symbolic link"):
        next(mi.ActivationStore(out).batches(HOOK))
    with pytest.raises(mi.StoreError, match=r"shard-00000\.safetensors is a symbolic link"):
        cache(model, out)
    with pytest.raises(mi.StoreError, match=r"shard-00000\.safetensors is a symbolic link"):
        cache(model, out, overwrite=True)  # not even discarded: the link is reported
    assert outside.read_bytes() == genuine and marker.read_bytes() == MARK
    assert sorted(p.name for p in marker.parent.iterdir()) == ["marker.txt", "shard.safetensors"]


def test_activation_manifest_link_directory_and_store_file_are_typed_errors(model, tmp_path,
                                                                             marker):
    out = tmp_path / "a"
    store = cache(model, out)
    (out / "manifest.json").rename(marker.parent / "manifest.json")
    os.symlink(marker.parent / "manifest.json", out / "manifest.json")
    with pytest.raises(mi.StoreError, match=r"manifest\.json is a symbolic link"):
        mi.ActivationStore(out)
    (out / "manifest.json").unlink()
    (marker.parent / "manifest.json").rename(out / "manifest.json")
    store.shards[2].unlink()
    store.shards[2].mkdir()
    with pytest.raises(mi.StoreError, match=r"shard-00002\.safetensors is a directory"):
        next(mi.ActivationStore(out).batches(HOOK))
    with pytest.raises(mi.StoreError, match=r"shard-00002\.safetensors is a directory"):
        cache(model, out)
    as_file = tmp_path / "file"
    as_file.write_text("x")
    with pytest.raises(mi.StoreError, match="file is a regular file, not a store directory"):
        cache(model, as_file)
    with pytest.raises(mi.StoreError, match="no such store directory"):
        mi.ActivationStore(tmp_path / "absent")
    intact(marker)


def test_a_shard_name_in_the_manifest_cannot_point_outside(model, tmp_path, marker):
    import json

    out = tmp_path / "a"
    cache(model, out)
    man = json.loads((out / "manifest.json").read_text())
    man["shards"][0]["file"] = "../outside/marker.txt"
    (out / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(mi.StoreError, match=r"shards\[0\]\.file: '\.\./outside/marker\.txt'"):
        mi.ActivationStore(out)
    intact(marker)
