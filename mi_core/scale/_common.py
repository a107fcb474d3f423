"""What the sweep store and the activation store share: errors, canonical JSON, keys,
fingerprints of models and functions, the store lock."""

from __future__ import annotations

import errno
import hashlib
import inspect
import json
import os
import struct
from pathlib import Path
from typing import Any, Callable

from mi_core.plugin import (
    DEFAULT_HUB_PATTERNS, MIError, MIModel, looks_like_hub_id, resolve_source,
)

#: bytes hashed at the start, at the end, and at each of `_SAMPLES` evenly spaced places of a
#: weight file for its fingerprint (content-sampled: cheap for multi-GB checkpoints)
_BLOCK = 1 << 20
_SAMPLES = 16


class SweepError(MIError):
    """A sweep cannot run as asked: a job is not JSON-able, ``fn`` cannot be shipped to worker
    processes, ``fn`` returned something that is not JSON-able, a batch came back short."""


class StoreError(MIError):
    """A sweep or activation store is incompatible (another model, function, format or
    mi-core version), corrupt, locked by another writer, or cannot be written (disk full)."""


def canonical_json(obj: Any, what: str = "value") -> str:
    """Compact JSON with sorted keys (the same text for the same content); SweepError naming
    `what` when `obj` is not JSON-able (NaN and infinities included)."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SweepError(f"{what} is not JSON-able ({exc}): {obj!r:.200}") from None


def job_key(job: Any, what: str = "job") -> str:
    """The stable key of a job: sha256 of its canonical JSON (first 32 hex digits)."""
    return hashlib.sha256(canonical_json(job, what).encode()).hexdigest()[:32]


def _file_fingerprint(path: Path, h: "hashlib._Hash") -> None:
    size = path.stat().st_size
    h.update(f"{path.name}:{size}:".encode())
    with path.open("rb") as f:
        if size <= (_SAMPLES + 2) * _BLOCK:
            h.update(f.read())
            return
        for off in [0, size - _BLOCK] + [size * (i + 1) // (_SAMPLES + 1) for i in range(_SAMPLES)]:
            f.seek(off)
            h.update(f.read(_BLOCK))


def source_fingerprint(path: Path) -> str:
    """sha256 over a checkpoint's files: small files whole, large ones (weights) by size plus
    18 sampled 1 MiB blocks, so a re-trained or re-quantised checkpoint changes it."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in files:
        if p.name.startswith(".") or ".cache" in p.parts:
            continue
        _file_fingerprint(p, h)
    return h.hexdigest()[:32]


def model_identity(model: Any) -> dict[str, str]:
    """``{"source": ..., "fingerprint": ...}`` of a path / hub id / MIModel.

    A local path (or an MIModel loaded from one) is fingerprinted by its files, so a store
    can be resumed with another executor; an MIModel with no file behind it (built in
    memory) by the hash of its logits on a fixed probe input.
    """
    source = os.fspath(model.source) if isinstance(model, MIModel) else os.fspath(model)
    path = _local_path(source)
    if path is not None:
        return {"source": source, "fingerprint": source_fingerprint(path)}
    if not isinstance(model, MIModel):
        raise StoreError(f"model {source!r}: not a local file or directory, nor a hub id in "
                         f"the local cache")
    import torch

    ids = torch.arange(min(8, model.vocab_size))[None]
    logits = model.forward(ids).output.float().cpu()
    values = logits.round(decimals=4).flatten().tolist()
    digest = hashlib.sha256(struct.pack(f"<{len(values)}f", *values)).hexdigest()[:32]
    return {"source": source, "fingerprint": "probe:" + digest}


def _local_path(source: str) -> Path | None:
    p = Path(source).expanduser()
    if p.exists():
        return p
    if looks_like_hub_id(source):
        try:
            return resolve_source(source, DEFAULT_HUB_PATTERNS)
        except MIError:
            return None
    return None


def fn_identity(fn: Callable[..., Any]) -> dict[str, str]:
    """``{"name": qualname, "module": ..., "source_hash": ...}``; the hash is of the function's
    source text (of its bytecode and constants when the source is unavailable). Stores compare
    name and source hash, not the module: a script's function is ``__main__.f`` when run and
    ``script.f`` when imported."""
    target = getattr(fn, "func", fn)  # functools.partial
    name = getattr(target, "__qualname__", repr(target))
    try:
        text = inspect.getsource(target)
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        text = repr((code.co_code, code.co_consts)) if code is not None else repr(target)
    if target is not fn:
        text += repr((getattr(fn, "args", ()), getattr(fn, "keywords", {})))
    return {"name": name, "module": str(getattr(target, "__module__", "?")),
            "source_hash": hashlib.sha256(text.encode()).hexdigest()[:32]}


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a short write continues, an error raises)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` through a temporary file + fsync + rename: never half-written."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def disk_error(exc: OSError, path: Path, saved: str) -> StoreError:
    """A StoreError for a failed write, saying what is safe on disk."""
    why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else str(exc)
    return StoreError(f"cannot write {path}: {why}; {saved} (nothing half-written: "
                      f"free some space and re-run to resume)")


class StoreLock:
    """An exclusive ``flock`` on ``<store>/.lock`` while a run writes: two writers of one
    store would break the one-record-per-key guarantee, so the second is refused."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> "StoreLock":
        import fcntl

        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            raise StoreError(f"{self.path.parent}: another process is writing this store "
                             f"(it holds {self.path})") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None
