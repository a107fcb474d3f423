"""The sweep store: a directory of append-only JSONL shards plus ``manifest.json``.

Layout::

    store/manifest.json     format, format_version, mi_core_version, model {source,
                            fingerprint}, fn {name, source_hash}, batch_size
    store/part-00000.jsonl  one record per line: {"key", "index", "job", "ok", "result",
    store/part-00001.jsonl   "error", "attempts", "seconds"}; each run appends to a new part
    store/.lock             flock held by the one writing process

Crash safety: every record is one line written with a single ``write`` on an ``O_APPEND``
descriptor (then fsynced by a background thread, see :meth:`SweepStore.append`); a process
killed at any moment leaves at most a torn *last* line in its part, which the next writer
truncates away (a reader ignores it). A write that fails
(disk full) is truncated back to the previous line before the error is raised. Keys are
content hashes of the jobs, a writer skips every key that already has a result, and the lock
keeps a second writer out: a result is never recorded twice.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator

import attrs

from mi_core.scale._common import StoreError, atomic_write_text, disk_error, write_all

FORMAT = "mi-core-sweep"
FORMAT_VERSION = 1
RECORDS_PER_PART = 100_000
_PART = re.compile(r"^part-(\d{5,})\.jsonl$")


@attrs.define
class SweepRecord:
    """One line of the store: a job's result (``ok``) or the error of its last attempt."""

    key: str
    index: int
    job: Any
    ok: bool
    result: Any = None
    error: str | None = None
    attempts: int = 1
    seconds: float = 0.0


def _parts(directory: Path) -> list[Path]:
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _PART.match(p.name))]
    return [p for _, p in sorted(found)]


def read_manifest(directory: Path) -> dict[str, Any] | None:
    path = directory / "manifest.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StoreError(f"{path}: not a sweep store manifest (format "
                         f"{data.get('format') if isinstance(data, dict) else None!r}, "
                         f"expected {FORMAT!r})")
    if data.get("format_version") != FORMAT_VERSION:
        raise StoreError(f"{path}: written in sweep store format version "
                         f"{data.get('format_version')!r} (by mi-core "
                         f"{data.get('mi_core_version')!r}); this mi-core reads version "
                         f"{FORMAT_VERSION}: use a new store, or overwrite=True to discard it")
    return data


def scan_part(path: Path, repair: bool) -> tuple[list[SweepRecord], int]:
    """The records of one part and the number of torn trailing bytes found (truncated away
    when `repair`). A malformed line that is not the last is corruption: StoreError."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # bytes after the last newline: empty unless the last write was torn
    records: list[SweepRecord] = []
    good_end = 0
    torn = len(tail)
    for i, line in enumerate(lines):
        try:
            raw = json.loads(line)
            rec = SweepRecord(**raw)
        except (ValueError, TypeError) as exc:
            if i == len(lines) - 1 and not tail:
                torn = len(line) + 1  # a complete-looking but unparsable last line
                break
            raise StoreError(f"{path}: line {i + 1} is not a valid record ({exc}); the store "
                             f"is corrupt (a torn write can only affect the last line)") from None
        records.append(rec)
        good_end += len(line) + 1
    if torn and repair:
        with path.open("r+b") as f:
            f.truncate(good_end)
            os.fsync(f.fileno())
    return records, torn


class SweepStore:
    """Reads a store's records; with :meth:`open_writer`, appends new ones."""

    def __init__(self, directory: Path, manifest: dict[str, Any],
                 records: dict[str, SweepRecord], torn: int = 0) -> None:
        self.directory = directory
        self.manifest = manifest
        self.records = records  # key -> the result, else the latest error
        self.torn_bytes = torn
        self._fd: int | None = None
        self._syncer: _Syncer | None = None
        self._part: Path | None = None
        self._in_part = 0

    @classmethod
    def load(cls, directory: str | os.PathLike[str], repair: bool = False) -> "SweepStore":
        d = Path(directory)
        manifest = read_manifest(d) if d.is_dir() else None
        if manifest is None:
            raise StoreError(f"{d}: no sweep store here (manifest.json missing)")
        records: dict[str, SweepRecord] = {}
        torn = 0
        for part in _parts(d):
            recs, t = scan_part(part, repair)
            torn += t
            for r in recs:
                old = records.get(r.key)
                if old is None or not old.ok:  # a result is final; a later error replaces one
                    records[r.key] = r
        return cls(d, manifest, records, torn)

    @classmethod
    def create(cls, directory: Path, manifest: dict[str, Any]) -> "SweepStore":
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / "manifest.json", json.dumps(manifest, indent=2) + "\n")
        return cls(directory, manifest, {})

    @staticmethod
    def discard(directory: Path) -> None:
        """Remove a store's own files (manifest, parts); nothing else in the directory."""
        for p in _parts(directory):
            p.unlink()
        for name in ("manifest.json", "manifest.json.tmp"):
            (directory / name).unlink(missing_ok=True)

    # -- queries ------------------------------------------------------------------------
    def done_keys(self) -> set[str]:
        return {k for k, r in self.records.items() if r.ok}

    def iter_records(self) -> Iterator[SweepRecord]:
        return iter(self.records.values())

    # -- writing ------------------------------------------------------------------------
    def _new_part(self) -> None:
        self.close()
        parts = _parts(self.directory)
        n = int(_PART.match(parts[-1].name).group(1)) + 1 if parts else 0  # type: ignore[union-attr]
        self._part = self.directory / f"part-{n:05d}.jsonl"
        self._fd = os.open(self._part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._in_part = 0
        self._syncer = _Syncer(self._fd)

    def _failed(self, exc: OSError) -> StoreError:
        n = sum(1 for r in self.records.values() if r.ok)
        return disk_error(exc, self._part or self.directory,
                          f"the {n} results recorded before are intact")

    def append(self, record: SweepRecord, line: str) -> None:
        """Append `record` (already serialised as `line`, no newline).

        One ``write`` of the whole line: once it returns, the line survives the death of this
        process. A background thread then fsyncs the part (group commit, off the compute
        path), so an OS crash loses at most the last few milliseconds. A failed write is
        truncated back and raises StoreError saying how many records are safe.
        """
        if record.ok and record.key in self.records and self.records[record.key].ok:
            return  # never twice (cannot happen through run_sweep; cheap to guarantee)
        if self._fd is None or self._in_part >= RECORDS_PER_PART:
            self._new_part()
        assert self._fd is not None and self._syncer is not None
        if self._syncer.error is not None:
            raise self._failed(self._syncer.error)
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            write_all(self._fd, (line + "\n").encode())
        except OSError as exc:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass  # a torn tail is also repaired by the next writer
            raise self._failed(exc) from None
        self._syncer.wake.set()
        self._in_part += 1
        self.records[record.key] = record

    def close(self) -> None:
        """Stop the syncer, fsync what it has not, close the part."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            syncer, self._syncer = self._syncer, None
            try:
                if syncer is not None:
                    syncer.stop()
                    if syncer.error is not None:
                        raise self._failed(syncer.error)
                try:
                    os.fsync(fd)
                except OSError as exc:
                    raise self._failed(exc) from None
            finally:
                os.close(fd)


class _Syncer(threading.Thread):
    """fsyncs one file descriptor whenever woken; several wake-ups during one fsync
    coalesce into the next (group commit)."""

    def __init__(self, fd: int) -> None:
        super().__init__(name="mi-sweep-fsync", daemon=True)
        self.fd = fd
        self.wake = threading.Event()
        self.error: OSError | None = None
        self._stopping = False
        self.start()

    def run(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            if self._stopping:
                return
            try:
                os.fsync(self.fd)
            except OSError as exc:
                self.error = exc
                return

    def stop(self) -> None:
        self._stopping = True
        self.wake.set()
        self.join()
