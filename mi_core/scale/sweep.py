"""Resumable sweeps: ``mi.run_sweep(fn, jobs, model=..., store=...)`` runs ``fn`` over
JSON-able jobs and records each result once in an append-only store (see
:mod:`mi_core.scale.store` for the format and the crash-safety argument)."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

from mi_core.plugin import ConfigError, HookPoint, converter, Progress
from mi_core.scale._common import (
    StoreError, SweepError, canonical_json, check_utf8, job_key, model_identity, strict_json,
)
from mi_core.scale._fs import StoreDir, StoreLock
from mi_core.scale._identity import describe_change, fn_identity
from mi_core.scale.executors import ensure_shippable, make_executor
from mi_core.scale.store import FORMAT, FORMAT_VERSION, SweepRecord, SweepStore, read_manifest

T = TypeVar("T")
#: marks a result strict JSON cannot hold in what _sweep_task returns
_UNSTORABLE = "mi-sweep-unstorable"


class SweepRun:
    """A sweep store seen through its jobs. From :func:`run_sweep` (the jobs of that call, in
    their order) or :func:`load_sweep` (every job recorded, in the order of the call that
    wrote it)."""

    def __init__(self, store: SweepStore, jobs: list[tuple[str, Any]] | None = None) -> None:
        self.store = store
        if jobs is None:
            recs = sorted(store.iter_records(), key=lambda r: r.index)
            jobs = [(r.key, r.job) for r in recs]
        self._jobs = jobs

    @property
    def directory(self) -> Path:
        return self.store.directory

    @property
    def manifest(self) -> dict[str, Any]:
        return self.store.manifest

    @property
    def total(self) -> int:
        return len(self._jobs)

    def results(self, as_type: type[T] | None = None) -> list[tuple[Any, Any]]:
        """(job, result) of every finished job, in job order; with `as_type` each result is
        structured into that attrs class through cattrs (the inverse of how it was stored)."""
        out = []
        for key, job in self._jobs:
            r = self.store.records.get(key)
            if r is not None and r.ok:
                res = r.result
                if as_type is not None:
                    res = converter.structure(res, as_type)
                out.append((job, res))
        return out

    def failed(self) -> list[tuple[Any, str]]:
        """(job, error text of its last attempt) of every job that has failed and has no result."""
        out = []
        for key, job in self._jobs:
            r = self.store.records.get(key)
            if r is not None and not r.ok:
                out.append((job, r.error or ""))
        return out

    def pending(self) -> list[Any]:
        """Jobs with neither a result nor an error (not run yet, or in flight when killed)."""
        return [job for key, job in self._jobs if key not in self.store.records]

    @property
    def complete(self) -> bool:
        return all(k in self.store.records and self.store.records[k].ok for k, _ in self._jobs)

    def __repr__(self) -> str:
        return (f"SweepRun({str(self.directory)!r}, done={len(self.results())}/{self.total}, "
                f"failed={len(self.failed())})")


def load_sweep(store: str | os.PathLike[str]) -> SweepRun:
    """Re-open a finished or interrupted sweep store read-only (a torn last line from a
    killed run is ignored, not repaired)."""
    return SweepRun(SweepStore.load(store, repair=False))


def _manifest(model_id: dict[str, str], fn_id: dict[str, str],
              batch_size: int | None) -> dict[str, Any]:
    from mi_core import __version__

    return {"format": FORMAT, "format_version": FORMAT_VERSION, "mi_core_version": __version__,
            "model": model_id, "fn": fn_id, "batch_size": batch_size}


def _check_same(directory: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    def fn_changes() -> list[str]:  # the module is informative only (see fn_identity)
        o, n = old.get("fn") or {}, new["fn"]
        out = [k for k in ("name", "source_hash") if o.get(k) != n.get(k)]
        ob, nb = o.get("bound") or {}, n.get("bound") or {}
        return out + sorted(k for k in set(ob) | set(nb) if ob.get(k) != nb.get(k))

    changes = fn_changes()
    if changes:
        raise StoreError(
            f"{directory}: this store was written with another function "
            f"({new['fn'].get('name')!r:.100}: {', '.join(map(describe_change, changes))} "
            f"changed since); its results would not be comparable. Use a new store, or "
            f"overwrite=True to discard the old results")
    for field, what in (("model", "model"), ("mi_core_version", "mi-core version")):
        if old.get(field) != new.get(field):
            raise StoreError(
                f"{directory}: this store was written with another {what} "
                f"({old.get(field)!r:.300}, now {new.get(field)!r:.300}); its results would not "
                f"be comparable. Use a new store, or overwrite=True to discard the old results")


def _sweep_task(fn: Callable[..., Any], batched: bool, model: Any, jobs: list[Any]
                ) -> list[str | tuple[str, str]]:
    """Run `fn` on one job (or a batch of them); each result as JSON text (cattrs unstructures
    attrs results; tensors become lists), or ``(_UNSTORABLE, why)`` for a result strict JSON
    cannot hold (NaN, infinities, lone surrogates, objects): that job's error, not its
    batch's."""
    if batched:
        out = fn(model, jobs)
        if not isinstance(out, (list, tuple)) or len(out) != len(jobs):
            raise SweepError(f"with batch_size, fn must return one result per job: got "
                             f"{type(out).__name__} of length {len(out) if hasattr(out, '__len__') else '?'} "
                             f"for {len(jobs)} jobs")
    else:
        out = [fn(model, jobs[0])]
    texts: list[str | tuple[str, str]] = []
    for r in out:
        try:
            text = json.dumps(converter.unstructure(r), separators=(",", ":"),
                              ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            texts.append((_UNSTORABLE, f"SweepError: fn returned a result that is not JSON-able "
                          f"({exc}; NaN and infinities are not JSON: return None or a "
                          f"string): {r!r:.200}"))
            continue
        try:
            check_utf8(text, "fn's result")
        except SweepError as exc:
            texts.append((_UNSTORABLE, f"SweepError: {exc}"))
            continue
        texts.append(text)
    return texts


def _record_line(key: str, index: int, job: Any, ok: bool, value: Any, attempts: int,
                 seconds: float) -> tuple[SweepRecord, bytes]:
    """A job's record and its line (strict JSON, UTF-8). `value`: the result's JSON text, or
    the error text. A result that does not read back as strict JSON (a duplicate key, e.g.
    ``{1: ..., "1": ...}``) is recorded as the job's error: what is written always loads."""
    result = None
    if ok and isinstance(value, tuple):  # (_UNSTORABLE, why) from _sweep_task
        ok, value = False, value[1]
    if ok:
        try:
            result = strict_json(value.encode("utf-8"), "fn's result")
        except (StoreError, UnicodeEncodeError) as exc:
            ok, value = False, f"SweepError: the result cannot be stored: {exc}"
    error = None if ok else value.encode("utf-8", "backslashreplace").decode("utf-8")
    rec = SweepRecord(key, index, job, ok, result, error, attempts, round(seconds, 6))
    line = (f'{{"key":"{key}","index":{index},"job":{canonical_json(job)},'
            f'"ok":{"true" if ok else "false"},'
            + (f'"result":{value},"error":null,' if ok else
               f'"result":null,"error":{json.dumps(error)},')
            + f'"attempts":{attempts},"seconds":{rec.seconds}}}')
    return rec, line.encode("utf-8")


def run_sweep(fn: Callable[..., Any], jobs: Iterable[Any], model: Any, store: str | os.PathLike[str],
              *, executor: str = "local", batch_size: int | None = None, retries: int = 1,
              overwrite: bool = False, hooks: Sequence[str | HookPoint] | None = None,
              workers: int | None = None, address: str | None = None, device: str = "cpu",
              progress: bool | None = None, model_dtype: str = "float32") -> SweepRun:
    """Run ``fn(model, job) -> result`` over `jobs`, each result recorded once in `store`.

    - `jobs`: JSON-able values (dicts, usually); a job's key is the hash of its canonical
      JSON, so equal jobs are one job. Non-JSON-able: SweepError before anything runs.
    - `model`: a path / hub id (each worker loads its own) or, for ``executor="local"``, a
      loaded MIModel.
    - `store`: a directory. Re-running the same call resumes: finished jobs are skipped,
      jobs that failed before are tried again. A store written with another `fn` (name or
      source), another model or another mi-core version is refused (StoreError) unless
      ``overwrite=True``, which discards its records first.
    - `executor`: ``"local"`` (default), ``"processes"`` (`workers` spawned processes) or
      ``"ray"`` (`address` or ``RAY_ADDRESS``, else a local Ray). Same results everywhere.
    - `batch_size`: when given, ``fn(model, jobs: list) -> list of results`` gets up to that
      many jobs at once (one forward for many prompts).
    - `retries`: a job (or batch) that raises is tried again up to this many times; then
      its error text is recorded (``run.failed()``) and the sweep goes on.
    - `hooks`: hook points `fn` uses, checked against the model before any job (HookError).
    - `progress`: done/total and rate on stderr (a bar on a terminal, lines when piped);
      None: as ``mi_core.plugin.set_progress`` says (default: on a terminal only).

    Results are whatever cattrs can unstructure to JSON (dicts, lists, numbers, attrs
    classes, tensors as lists); read them back with ``run.results(as_type=...)``.
    """
    if batch_size is not None and int(batch_size) < 1:
        raise ConfigError(f"batch_size must be >= 1 or None, got {batch_size!r}")
    if int(retries) < 0:
        raise ConfigError(f"retries must be >= 0, got {retries!r}")
    keyed: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for i, job in enumerate(jobs):
        k = job_key(job, f"job {i}")
        if k not in seen:
            seen.add(k)
            keyed.append((k, job))
    hook_names = [HookPoint.parse(h).name for h in (hooks or [])]
    manifest = _manifest(model_identity(model), fn_identity(fn), batch_size)
    with StoreDir(store, create=True) as sdir, StoreLock(sdir):
        if overwrite:
            SweepStore.discard(sdir)
        old = read_manifest(sdir)
        if old is None:
            st = SweepStore.create(sdir, manifest)
        else:
            _check_same(sdir.path, old, manifest)
            st = SweepStore.load(sdir, repair=True)
        run = SweepRun(st, keyed)
        try:
            _execute(run, fn, model, executor, batch_size, int(retries), hook_names, workers,
                     address, device, progress, model_dtype)
        finally:
            st.close()
    return run


def _execute(run: SweepRun, fn: Callable[..., Any], model: Any, executor: str,
             batch_size: int | None, retries: int, hooks: list[str], workers: int | None,
             address: str | None, device: str, progress: bool | None,
             model_dtype: str = "float32") -> None:
    st = run.store
    done = st.done_keys()
    todo = [(i, k, job) for i, (k, job) in enumerate(run._jobs) if k not in done]
    if not todo:
        return
    bs = batch_size or 1
    batches = [todo[i:i + bs] for i in range(0, len(todo), bs)]
    attempts = [0] * len(batches)
    ex = make_executor(executor, model, device, workers, address, dtype=model_dtype)
    task = functools.partial(_sweep_task, fn, batch_size is not None)
    if executor == "processes":  # before any worker starts: fn must be importable by name
        ensure_shippable(fn, "the job function")
    bar = Progress(run.total, f"sweep {st.directory.name}", unit="job", enabled=progress,
                   initial=run.total - len(todo))
    try:
        ex.start(hooks)
        queue = list(range(len(batches)))
        while queue:
            retry: list[int] = []
            started = {b: time.perf_counter() for b in queue}

            def payloads() -> Iterable[tuple[int, Any]]:
                for b in queue:
                    attempts[b] += 1
                    yield b, [job for _, _, job in batches[b]]

            for b, ok, value in ex.run(task, payloads()):
                secs = (time.perf_counter() - started[b]) / len(batches[b])
                if not ok and attempts[b] <= retries:
                    retry.append(b)
                    continue
                for pos, (i, k, job) in enumerate(batches[b]):
                    rec, line = _record_line(k, i, job, ok, value[pos] if ok else value,
                                             attempts[b], secs)
                    st.append(rec, line)
                    bar.update(1 if rec.ok else 0)
                if not all(st.records[k].ok for _, k, _ in batches[b]):
                    bar.note = f"{len(run.failed())} failed"
            queue = retry
    finally:
        bar.close()
        ex.close()
