"""What the sweep store and the activation store share: errors, canonical JSON, keys,
fingerprints of models, strict JSON reading (the function's identity is in
:mod:`mi_core.scale._identity`, the confined directory and lock in :mod:`mi_core.scale._fs`)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

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
    `what` when `obj` is not JSON-able (NaN and infinities included) or holds a lone
    surrogate."""
    try:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SweepError(f"{what} is not JSON-able ({exc}): {obj!r:.200}") from None
    check_utf8(text, what)
    return text


def check_utf8(text: str, what: str) -> None:
    """SweepError naming `what` when `text` holds a lone surrogate (UTF-8 cannot store it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SweepError(f"{what} holds a lone surrogate (U+{ord(text[exc.start]):04X} at "
                         f"character {exc.start} of its JSON) that UTF-8 cannot store: "
                         f"{text[max(0, exc.start - 40):exc.start + 40]!r}") from None


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


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a short write continues, an error raises)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def strict_json(raw: bytes, where: str, duplicates: bool = True) -> Any:
    """Parse a store file's JSON strictly: UTF-8, no NaN / Infinity and, with `duplicates`,
    no duplicate keys; StoreError naming `where` otherwise. (Sweep records skip the
    duplicate check, a Python call per object: every field of a record is checked after
    parsing, and its key against its job as parsed.)"""
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items):
            dup = next(k for i, (k, _) in enumerate(items) if k in dict(items[:i]))
            raise ValueError(f"duplicate key {dup!r:.60}")
        return out

    try:
        return json.loads(raw.decode("utf-8"), parse_constant=no_constant,
                          object_pairs_hook=pairs if duplicates else None)
    except (ValueError, RecursionError) as exc:
        raise StoreError(f"{where}: not valid JSON ({exc})") from None


def disk_error(exc: OSError, path: Path, saved: str) -> StoreError:
    """A StoreError for a failed write, saying what is safe on disk."""
    why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else str(exc)
    return StoreError(f"cannot write {path}: {why}; {saved} (nothing half-written: "
                      f"free some space and re-run to resume)")
