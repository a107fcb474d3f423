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

Confinement and validation: every file is opened inside the store without following links
(:mod:`mi_core.scale._fs`); the manifest and every record are strict JSON, checked field by
field when read (``ok`` a bool, ``key`` the hash of ``job``, ...): a record that is not what
this module writes is a StoreError naming the part, the line and the field.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator

import attrs

from mi_core.scale._common import (
    StoreError, SweepError, disk_error, job_key, strict_json, write_all,
)
from mi_core.scale._fs import StoreDir, oserror

FORMAT = "mi-core-sweep"
FORMAT_VERSION = 1
RECORDS_PER_PART = 100_000
_PART = re.compile(r"^part-(\d{5,})\.jsonl$")
_FIELDS = ("key", "index", "job", "ok", "result", "error", "attempts", "seconds")
_MANIFEST_LIMIT = 1 << 20


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


def _parts(sdir: StoreDir) -> list[str]:
    found = [(int(m.group(1)), n) for n in sdir.names() if (m := _PART.match(n))]
    return [n for _, n in sorted(found)]


def _need(cond: bool, where: str, key: str, msg: str) -> None:
    if not cond:
        raise StoreError(f"{where}: {key}: {msg}; not a sweep store manifest of this format")


def read_manifest(sdir: StoreDir) -> dict[str, Any] | None:
    """The store's manifest, validated; None when there is none."""
    raw = sdir.read_bytes("manifest.json", limit=_MANIFEST_LIMIT)
    if raw is None:
        return None
    where = str(sdir.file("manifest.json"))
    data = strict_json(raw, where)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StoreError(f"{where}: not a sweep store manifest (format "
                         f"{data.get('format') if isinstance(data, dict) else None!r:.60}, "
                         f"expected {FORMAT!r})")
    if data.get("format_version") != FORMAT_VERSION:
        raise StoreError(f"{where}: written in sweep store format version "
                         f"{data.get('format_version')!r:.20} (by mi-core "
                         f"{data.get('mi_core_version')!r:.20}); this mi-core reads version "
                         f"{FORMAT_VERSION}: use a new store, or overwrite=True to discard it")
    _need(isinstance(data.get("mi_core_version"), str), where, "mi_core_version",
          "expected a string")
    model, fn = data.get("model"), data.get("fn")
    _need(isinstance(model, dict) and all(isinstance(model.get(k), str)
                                          for k in ("source", "fingerprint")),
          where, "model", "expected an object with string source and fingerprint")
    _need(isinstance(fn, dict) and all(isinstance(fn.get(k), str)
                                       for k in ("name", "source_hash")), where, "fn",
          "expected an object with string name and source_hash")
    _need(isinstance(fn.get("bound", {}), dict), where, "fn.bound", "expected an object")
    bs = data.get("batch_size")
    _need(bs is None or (type(bs) is int and bs >= 1), where, "batch_size",
          f"{bs!r:.40} is not null or an integer >= 1")
    return data


def _problem(raw: Any) -> tuple[str, str] | None:
    """(field, what is wrong) of the first field of a parsed line that is not what
    :func:`mi_core.scale.sweep._record_line` writes; None for a valid record. Messages are
    built only on failure (a store of 100,000 records is checked on every load)."""
    if not isinstance(raw, dict):
        return "record", f"expected a JSON object, got {type(raw).__name__}"
    if len(raw) != len(_FIELDS) or any(f not in raw for f in _FIELDS):
        return "record", f"fields {sorted(raw)}, expected {sorted(_FIELDS)}"
    ok, index, error = raw["ok"], raw["index"], raw["error"]
    attempts, seconds = raw["attempts"], raw["seconds"]
    if ok is not True and ok is not False:
        return "ok", f"{ok!r:.40} is not true or false"
    if type(index) is not int or index < 0:
        return "index", f"{index!r:.40} is not an integer >= 0"
    if type(attempts) is not int or attempts < 1:
        return "attempts", f"{attempts!r:.40} is not an integer >= 1"
    if type(seconds) not in (int, float) or seconds < 0:
        return "seconds", f"{seconds!r:.40} is not a number >= 0"
    if ok and error is not None:
        return "error", "a result has no error"
    if not ok and (not isinstance(error, str) or raw["result"] is not None):
        return ("error", "a failure needs its error text") if not isinstance(error, str) else (
            "result", "a failure has no result")
    try:
        key = job_key(raw["job"])
    except SweepError as exc:
        return "job", str(exc)
    if raw["key"] != key:
        return "key", (f"{raw['key']!r:.40} is not the key of its job ({key}): the record "
                       f"would pair a result with another job")
    return None


def _record(raw: Any, where: str) -> SweepRecord:
    """The record of one parsed line, every field checked (StoreError naming it)."""
    problem = _problem(raw)
    if problem is not None:
        raise StoreError(f"{where}: field {problem[0]!r}: {problem[1]}; the store is corrupt or "
                         f"was edited (records are written by mi-core only)")
    return SweepRecord(**raw)


def scan_part(sdir: StoreDir, name: str, repair: bool) -> tuple[list[SweepRecord], int]:
    """The records of one part and the number of torn trailing bytes found (truncated away
    when `repair`). A malformed line that is not the last, or a line that parses but is not
    a valid record, is corruption: StoreError naming the part, the line and the field."""
    data = sdir.read_bytes(name)
    path = sdir.file(name)
    if data is None:
        return [], 0
    lines = data.split(b"\n")
    tail = lines.pop()  # bytes after the last newline: empty unless the last write was torn
    records: list[SweepRecord] = []
    good_end = 0
    torn = len(tail)
    for i, line in enumerate(lines):
        try:
            raw = strict_json(line, f"{path}: line {i + 1}", duplicates=False)
        except StoreError as exc:
            if i == len(lines) - 1 and not tail:
                torn = len(line) + 1  # a complete-looking but unparsable last line
                break
            raise StoreError(f"{exc}; the store is corrupt (a torn write can only affect the "
                             f"last line)") from None
        records.append(_record(raw, f"{path}: line {i + 1}"))
        good_end += len(line) + 1
    if torn and repair:
        fd = sdir.open_write(name)
        try:
            os.ftruncate(fd, good_end)
            os.fsync(fd)
        except OSError as exc:
            raise oserror(exc, path, "repair") from None
        finally:
            os.close(fd)
    return records, torn


class SweepStore:
    """A store's records; :meth:`append` adds new ones (the store's directory stays open
    while it writes, see :meth:`close`)."""

    def __init__(self, sdir: StoreDir, manifest: dict[str, Any],
                 records: dict[str, SweepRecord], torn: int = 0) -> None:
        self.sdir = sdir
        self.directory = sdir.path
        self.manifest = manifest
        self.records = records  # key -> the result, else the latest error
        self.torn_bytes = torn
        self._fd: int | None = None
        self._syncer: _Syncer | None = None
        self._part: Path | None = None
        self._in_part = 0

    @classmethod
    def load(cls, directory: str | os.PathLike[str] | StoreDir, repair: bool = False
             ) -> "SweepStore":
        """Read a store: `directory` a path (read, then closed) or the open StoreDir of a
        writer (`repair` truncates a torn last line)."""
        sdir = directory if isinstance(directory, StoreDir) else StoreDir(directory)
        try:
            manifest = read_manifest(sdir)
            if manifest is None:
                raise StoreError(f"{sdir.path}: no sweep store here (manifest.json missing)")
            records: dict[str, SweepRecord] = {}
            torn = 0
            for part in _parts(sdir):
                recs, t = scan_part(sdir, part, repair)
                torn += t
                for r in recs:
                    old = records.get(r.key)
                    if old is None or not old.ok:  # a result is final; a later error replaces one
                        records[r.key] = r
        finally:
            if sdir is not directory:
                sdir.close()
        return cls(sdir, manifest, records, torn)

    @classmethod
    def create(cls, sdir: StoreDir, manifest: dict[str, Any]) -> "SweepStore":
        sdir.write_atomic("manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
        return cls(sdir, manifest, {})

    @staticmethod
    def discard(sdir: StoreDir) -> None:
        """Remove a store's own files (manifest, parts; links themselves, never what they
        point to); nothing else in the directory."""
        for name in _parts(sdir) + ["manifest.json", "manifest.json.tmp"]:
            sdir.unlink(name)

    # -- queries ------------------------------------------------------------------------
    def done_keys(self) -> set[str]:
        return {k for k, r in self.records.items() if r.ok}

    def iter_records(self) -> Iterator[SweepRecord]:
        return iter(self.records.values())

    # -- writing ------------------------------------------------------------------------
    def _new_part(self) -> None:
        self.close()
        parts = _parts(self.sdir)
        n = int(_PART.match(parts[-1]).group(1)) + 1 if parts else 0  # type: ignore[union-attr]
        name = f"part-{n:05d}.jsonl"
        self._part = self.sdir.file(name)
        self._fd = self.sdir.create(name, append=True)  # new, never through a link
        self._in_part = 0
        self._syncer = _Syncer(self._fd)

    def _failed(self, exc: OSError) -> StoreError:
        n = sum(1 for r in self.records.values() if r.ok)
        return disk_error(exc, self._part or self.directory,
                          f"the {n} results recorded before are intact")

    def append(self, record: SweepRecord, line: bytes) -> None:
        """Append `record` (already serialised as UTF-8 `line`, no newline).

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
            write_all(self._fd, line + b"\n")
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
