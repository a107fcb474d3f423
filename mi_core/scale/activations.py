"""Activation stores: stream the activations of any hook points over a token stream into
safetensors shards (:func:`cache_activations`) and read them back memory-mapped, shuffled
through a bounded buffer (:class:`ActivationStore`).

Layout::

    out/manifest.json           format, versions, model {source, fingerprint}, inputs_hash,
                                context_len, batch_size, rows, tokens, hooks {name: dtype,
                                per-token shape, bytes per token, layout}, shards [{index,
                                file, rows, token_range, tokens, bytes, header_sha256,
                                sha256}], planned_bytes
    out/shard-00000.safetensors one tensor per hook, [tokens of the shard, *per-token shape],
                                plus ``tokens`` [tokens] int32 (the input ids)
    out/.lock                   flock of the process writing

Activations are token-major: a hook of shape [batch, seq, *rest] is stored as
[batch * seq, *rest]; attention patterns / scores [batch, heads, q, k] as [batch * q, heads,
k] (one row per query token). A shard's file is written under a temporary name at known
offsets (its size is known up front) by a writer thread while the next batches compute, then
fsynced, hashed and renamed: a shard file is either complete or absent, and a re-run computes
only the absent ones. Every file is opened inside the store without following links
(:mod:`mi_core.scale._fs`); every shard is checked against the manifest when read
(:mod:`mi_core.scale.shards`). No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import attrs
import torch

from mi_core.plugin import ConfigError, HookError, HookPoint, HookSpec, Progress
from mi_core.scale._common import StoreError, disk_error, model_identity, strict_json
from mi_core.scale._fs import StoreDir, StoreLock
from mi_core.scale.executors import make_executor
from mi_core.scale.shards import (
    DTYPES, FORMAT, SHARD_NAME, ShardFile, file_sha256, ids_sha256, map_shard, open_shard,
    per_token_bytes, plan_entry, shard_metadata, shard_tensors_plan, validate_manifest,
)

FORMAT_VERSION = 2
_QUERY_MAJOR = ("attn.hook_pattern", "attn.hook_attn_scores", "attn.hook_scores")
_MANIFEST_LIMIT = 1 << 26  # 64 MiB: a manifest lists shards, ~300 bytes each


@attrs.define
class CacheReport:
    """What :func:`cache_activations` planned and did. ``planned_bytes`` is the size of the
    whole store (shards; manifest aside), ``todo_bytes`` what this call writes."""

    tokens: int
    rows: int
    shards: int
    shards_done_before: int
    planned_bytes: int
    todo_bytes: int
    free_bytes: int
    seconds: float = 0.0

    def summary(self) -> str:
        gib = 1 << 30
        return (f"{self.tokens} tokens ({self.rows} rows) -> {self.planned_bytes / gib:.3f} GiB "
                f"in {self.shards} shards ({self.shards_done_before} already done, "
                f"{self.todo_bytes / gib:.3f} GiB to write; {self.free_bytes / gib:.1f} GiB free)")


# -- worker tasks (module level: they are sent to worker processes / Ray actors) ----------

def _layout(name: str, shape: Sequence[int], seq: int) -> str:
    """"token" ([batch, seq, ...]) or "query" ([batch, heads, q, k]); StoreError otherwise."""
    if name.endswith(_QUERY_MAJOR) and len(shape) == 4:
        return "query"
    if len(shape) >= 2 and shape[1] == seq:
        return "token"
    raise StoreError(f"hook point {name!r} has shape {list(shape)}, with no sequence axis of "
                     f"length {seq} at dimension 1: it cannot be stored per token")


def _token_major(t: torch.Tensor, layout: str, dtype: torch.dtype) -> torch.Tensor:
    if layout == "query":
        t = t.transpose(1, 2)
    return t.reshape(-1, *t.shape[2:]).to(device="cpu", dtype=dtype).contiguous()


def _stored(name: str, t: torch.Tensor, layout: str, dtype: torch.dtype) -> torch.Tensor:
    """`t` token-major in the store's `dtype`; StoreError naming the hook point when a finite
    value becomes infinite there (float16 holds at most 65504). The check is one ``isinf``
    over the converted values, and only when the dtype changes."""
    out = _token_major(t, layout, dtype)
    if dtype == t.dtype or not out.is_floating_point() or not bool(torch.isinf(out).any()):
        return out
    src = _token_major(t, layout, t.dtype)
    over = torch.isinf(out) & torch.isfinite(src)
    n = int(over.sum())
    if not n:
        return out  # infinities of the model's own, stored as they are
    big = float(src[over].abs().max())
    raise StoreError(f"hook point {name!r}: {n} of {out.numel()} values overflow the store's "
                     f"dtype {str(dtype).removeprefix('torch.')} (largest magnitude {big:.6g}; "
                     f"it holds at most {torch.finfo(dtype).max:.6g}); store in float32 or "
                     f"bfloat16")


def _tokenize_task(model: Any, texts: list[str]) -> list[list[int]]:
    tok = model.tokenizer
    return [tok.encode(t, add_special_tokens=True) for t in texts]


def _probe_task(model: Any, payload: tuple[list[str], int]) -> dict[str, Any]:
    """Per-token shape, dtype and layout of each hook, from a forward of one short row (the
    real batches are checked against it as they are written)."""
    hooks, context_len = payload
    seq = min(context_len, 11)  # short: the probe costs a fraction of one batch
    ids = torch.zeros(1, seq, dtype=torch.long)
    cache = model.forward(ids, HookSpec().capture_all(hooks))
    out = {}
    for h in hooks:
        t = cache.require(h)
        layout = _layout(h, t.shape, seq)
        # query-major points: [heads, keys], keys = the row length
        per = [t.shape[1], context_len] if layout == "query" else list(t.shape[2:])
        out[h] = {"shape": per, "dtype": str(t.dtype).removeprefix("torch."), "layout": layout}
    return out


# -- inputs ---------------------------------------------------------------------------------

def _rows_from(inputs: Any, context_len: int, ex: Any) -> tuple[torch.Tensor, int]:
    """(rows [n, context_len] int64, tokens dropped). Texts are tokenized (special tokens as
    the tokenizer adds them), concatenated and cut into rows; the incomplete last row is
    dropped. Token batches ([b, context_len] tensors or lists of rows) are used as given."""
    if isinstance(inputs, torch.Tensor):
        inputs = [inputs]
    items = list(inputs)
    if items and all(isinstance(x, str) for x in items):
        (_, _, ids), = ex.run(_tokenize_task, [(0, items)])
        if isinstance(ids, str):
            raise ConfigError(f"cannot tokenize the texts: {ids}")
        stream = torch.tensor([i for row in ids for i in row], dtype=torch.long)
        n = stream.numel() // context_len
        return stream[: n * context_len].reshape(n, context_len), stream.numel() - n * context_len
    rows = []
    for bi, b in enumerate(items):
        if isinstance(b, str):
            raise ConfigError(f"input {bi} is text but others are token batches: give texts "
                              f"or token batches, not both")
        t = torch.as_tensor(b, dtype=torch.long)
        t = t[None] if t.dim() == 1 else t
        if t.dim() != 2 or t.shape[1] != context_len:
            raise ConfigError(f"token batch {bi} has shape {list(t.shape)}; token batches must "
                              f"be [batch, context_len={context_len}]")
        rows.append(t.cpu())
    if not rows:
        raise ConfigError("cache_activations got no inputs")
    return torch.cat(rows), 0


def _inputs_hash(rows: torch.Tensor) -> str:
    ids = rows.reshape(-1).tolist()
    return hashlib.sha256(struct.pack(f"<{len(ids)}q", *ids)).hexdigest()[:32]


# -- the public function ----------------------------------------------------------------------

def cache_activations(model: Any, texts_or_token_batches: Any, hooks: Sequence[str | HookPoint],
                      out: str | os.PathLike[str], *, context_len: int = 128, batch_size: int = 32,
                      tokens_per_shard: int = 2**20, executor: str = "local",
                      dtype: torch.dtype | None = None, overwrite: bool = False,
                      workers: int | None = None, address: str | None = None,
                      device: str = "cpu", progress: bool | None = None,
                      verbose: bool = True) -> "ActivationStore":
    """Run `model` over the inputs and store the activations at `hooks` under `out`.

    - inputs: texts (tokenized, concatenated, cut into rows of `context_len`; the last
      incomplete row is dropped) or token batches ``[batch, context_len]`` used as given.
    - forwards of `batch_size` rows; shards of ``tokens_per_shard // context_len`` rows.
    - `dtype`: storage dtype (default: the model's activation dtype); a floating dtype for
      floating activations. A value that overflows it (beyond 65504 in float16) is a
      StoreError naming the hook point and the shard, never a stored inf.
    - resumable: re-running the same call writes only the shards still missing. Another
      model, other inputs, hooks, context_len or dtype against an existing store is a
      StoreError unless ``overwrite=True`` (which discards it).
    - the disk use is computed before any compute, printed (`verbose`) and returned in
      ``store.report``; more than the free space is a StoreError up front.
    - `executor`: ``"local"``, ``"processes"`` or ``"ray"`` (model as a path for the last
      two); the driver writes, workers compute.
    - `out` must be a directory (created) and not a symbolic link; every file in it is
      opened without following links (a planted link is a StoreError naming it).

    Returns the :class:`ActivationStore`. HookError (before any compute) for a hook point
    the model lacks.
    """
    t0 = time.perf_counter()
    if context_len < 1 or batch_size < 1 or tokens_per_shard < 1:
        raise ConfigError(f"context_len, batch_size and tokens_per_shard must be >= 1 (got "
                          f"{context_len}, {batch_size}, {tokens_per_shard})")
    names = [HookPoint.parse(h).name for h in hooks]
    if not names:
        raise ConfigError("cache_activations needs at least one hook point")
    ex = make_executor(executor, model, device, workers, address)
    with StoreDir(out, create=True) as sdir, StoreLock(sdir):
        try:
            ex.start(names)
            rows, dropped = _rows_from(texts_or_token_batches, context_len, ex)
            (_, ok, probe), = ex.run(_probe_task, [(0, (names, context_len))])
            if not ok:
                raise StoreError(f"cannot capture {names}: {probe}")
            manifest = _plan(model, names, probe, rows, dropped, context_len, batch_size,
                             tokens_per_shard, dtype)
            report = _prepare(sdir, manifest, rows, overwrite)
            logging.getLogger("mi_core.scale").info("cache_activations %s: %s", sdir.path,
                                                    report.summary())
            if verbose:
                print(f"mi: cache_activations: {report.summary()}", file=sys.stderr)
            if report.todo_bytes > report.free_bytes:
                raise StoreError(f"{sdir.path}: the store needs {report.todo_bytes} more bytes, "
                                 f"only {report.free_bytes} are free; nothing was written")
            _fill(sdir, manifest, rows, ex, progress)
        finally:
            ex.close()
    report.seconds = time.perf_counter() - t0
    store = ActivationStore(out)
    store.report = report
    return store


def _prepare(sdir: StoreDir, manifest: dict[str, Any], rows: torch.Tensor,
             overwrite: bool) -> CacheReport:
    """Check an existing store against the plan (or discard it), remove a killed run's
    temporary files, write the manifest; the report of what is done and what is to do."""
    old = None
    if overwrite:
        _discard(sdir)
    else:
        old = read_manifest(sdir)
        if old is not None:
            _check_same(sdir.path, old, manifest)
            for new, prev in zip(manifest["shards"], old["shards"]):
                if prev.get("sha256") and prev["header_sha256"] == new["header_sha256"]:
                    new["sha256"] = prev["sha256"]
    for name in sdir.names():
        if name.endswith(".tmp") and (SHARD_NAME.match(name[:-4]) or name == "manifest.json.tmp"):
            sdir.unlink(name)  # a shard a killed run was writing: recomputed
    done = [s for s in manifest["shards"] if sdir.is_file(s["file"])]
    for s in done:  # a finished shard must be the one planned (fast check), with its checksum
        fd, _, _ = open_shard(sdir, s, manifest["hooks"])
        try:
            if not s.get("sha256"):  # finished by a run killed before it recorded the sum
                s["sha256"] = file_sha256(fd)
        finally:
            os.close(fd)
    if manifest != old:  # a finished store is not rewritten (it may be read-only)
        write_manifest(sdir, manifest)
    per_token = sum(v["bytes_per_token"] for v in manifest["hooks"].values()) + 4
    todo_tokens = manifest["tokens"] - sum(s["tokens"] for s in done)
    return CacheReport(manifest["tokens"], manifest["rows"], len(manifest["shards"]), len(done),
                       manifest["planned_bytes"], todo_tokens * per_token,
                       shutil.disk_usage(sdir.path).free)


def _store_dtype(name: str, probed: str, dtype: torch.dtype | None) -> torch.dtype:
    src = DTYPES.get(probed)
    dt = dtype or src
    if dt not in DTYPES.values():
        raise ConfigError(f"cannot store dtype {dt} (one of {sorted(DTYPES)})")
    if dt != src and (src is None or not (dt.is_floating_point and src.is_floating_point)):
        raise ConfigError(f"hook point {name!r} is {probed}: it can be stored as {probed} or, "
                          f"if floating, another floating dtype, not {dt} (values would be "
                          f"truncated)")
    return dt


def _plan(model: Any, names: list[str], probe: dict[str, Any], rows: torch.Tensor, dropped: int,
          context_len: int, batch_size: int, tokens_per_shard: int,
          dtype: torch.dtype | None) -> dict[str, Any]:
    from mi_core import __version__

    hooks = {}
    for h in names:
        dt = str(_store_dtype(h, probe[h]["dtype"], dtype)).removeprefix("torch.")
        per = probe[h]["shape"]
        hooks[h] = {"dtype": dt, "shape": per, "bytes_per_token": per_token_bytes(per, dt),
                    "layout": probe[h]["layout"]}
    n = rows.shape[0]
    rps = max(1, tokens_per_shard // context_len)
    shards = [plan_entry(s, (a, min(a + rps, n)), context_len, hooks, rows[a:min(a + rps, n)])
              for s, a in enumerate(range(0, n, rps))]
    per_token = sum(v["bytes_per_token"] for v in hooks.values()) + 4  # + the int32 token id
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "mi_core_version": __version__,
            "model": model_identity(model), "inputs_hash": _inputs_hash(rows),
            "context_len": context_len, "batch_size": batch_size, "rows": n,
            "tokens": n * context_len, "tokens_dropped": dropped, "rows_per_shard": rps,
            "hooks": hooks, "shards": shards, "planned_bytes": n * context_len * per_token}


def read_manifest(sdir: StoreDir) -> dict[str, Any] | None:
    """The store's validated manifest, None when there is none (StoreError naming the key
    when it is not a manifest of this format)."""
    raw = sdir.read_bytes("manifest.json", limit=_MANIFEST_LIMIT)
    if raw is None:
        return None
    where = str(sdir.file("manifest.json"))
    return validate_manifest(strict_json(raw, where), where, FORMAT_VERSION)


def write_manifest(sdir: StoreDir, manifest: dict[str, Any]) -> None:
    sdir.write_atomic("manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())


def _check_same(directory: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    for field in ("mi_core_version", "model", "inputs_hash", "context_len", "hooks",
                  "rows_per_shard", "batch_size"):
        if old.get(field) != new.get(field):
            raise StoreError(f"{directory}: the store was written with another {field} "
                             f"({old.get(field)!r:.200}, now {new.get(field)!r:.200}); use a new "
                             f"directory, or overwrite=True to discard it")


def _discard(sdir: StoreDir) -> None:
    """Remove the store's own files (links are removed, never followed)."""
    for name in sdir.names():
        base = name[:-4] if name.endswith(".tmp") else name
        if SHARD_NAME.match(base) or base == "manifest.json":
            sdir.unlink(name)


class _Writer:
    """The two threads of :func:`_fill`. :meth:`run` puts each captured batch at its offsets
    in its shard file and hands a shard whose last batch is in to :meth:`finish_all`, which
    fsyncs it, hashes it (hashlib releases the GIL: this overlaps the next shard's writes
    and forwards), renames it into place and records its checksum in the manifest (the only
    writer of the manifest while they run). The first error stops both."""

    def __init__(self, sdir: StoreDir, manifest: dict[str, Any], rows: torch.Tensor,
                 n_batches: dict[int, int]) -> None:
        self.sdir, self.manifest, self.rows, self.n_batches = sdir, manifest, rows, n_batches
        self.hooks = manifest["hooks"]
        self.files: dict[int, ShardFile] = {}
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=4)
        self.finished: queue.Queue[Any] = queue.Queue()  # (shard index, ShardFile) | None
        self.failure: list[BaseException] = []

    def _failed(self, exc: BaseException, si: int) -> None:
        if isinstance(exc, OSError):
            shards = self.manifest["shards"]
            saved = sum(1 for s in shards if s.get("sha256"))
            exc = disk_error(exc, self.sdir.file(shards[si]["file"]),
                             f"the {saved} complete shards are intact")
        self.failure.append(exc)

    def open_shard(self, si: int) -> ShardFile:
        s = self.manifest["shards"][si]
        a, b = s["rows"]
        return ShardFile(self.sdir, s, shard_tensors_plan(self.hooks, s["tokens"]),
                         shard_metadata(s, ids_sha256(self.rows[a:b])), self.n_batches[si])

    def run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.failure:
                continue  # drain after an error
            si, r0, r1, acts = item
            try:
                self.write(si, r0, r1, acts)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the driver
                self._failed(exc, si)

    def finish_all(self) -> None:
        while True:
            item = self.finished.get()
            if item is None:
                return
            si, f = item
            try:  # a complete shard is finished even after another one failed
                self.manifest["shards"][si]["sha256"] = f.finish()
                write_manifest(self.sdir, self.manifest)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the driver
                self._failed(exc, si)

    def write(self, si: int, r0: int, r1: int, acts: dict[str, torch.Tensor]) -> None:
        ctx = self.manifest["context_len"]
        for h, v in self.hooks.items():  # the plan came from a probe: every batch must fit it
            want = [(r1 - r0) * ctx] + v["shape"]
            if list(acts[h].shape) != want or str(acts[h].dtype) != "torch." + v["dtype"]:
                raise StoreError(f"hook point {h!r}: a batch of rows {r0}..{r1} is "
                                 f"{acts[h].dtype} {list(acts[h].shape)}, the store expects "
                                 f"{v['dtype']} {want}")
        f = self.files.get(si) or self.files.setdefault(si, self.open_shard(si))
        tok0 = (r0 - self.manifest["shards"][si]["rows"][0]) * ctx
        for h, v in self.hooks.items():
            f.write(h, tok0, v["bytes_per_token"], acts[h])
        f.write("tokens", tok0, 4, self.rows[r0:r1].reshape(-1).to(torch.int32))
        f.left -= 1
        if f.left == 0:
            del self.files[si]
            self.finished.put((si, f))


def _fill(sdir: StoreDir, manifest: dict[str, Any], rows: torch.Tensor, ex: Any,
          progress: bool | None) -> None:
    """Compute the missing shards; a writer thread puts each batch at its offsets."""
    hooks = manifest["hooks"]
    names = list(hooks)
    layouts = {h: v["layout"] for h, v in hooks.items()}
    ctx, bs = manifest["context_len"], manifest["batch_size"]
    dtypes = {h: v["dtype"] for h, v in hooks.items()}
    todo = [(si, s) for si, s in enumerate(manifest["shards"]) if not sdir.is_file(s["file"])]
    if not todo:
        return
    batches: list[tuple[int, int, int]] = []  # (shard index, first row, end row)
    for si, s in todo:
        a, b = s["rows"]
        batches += [(si, r, min(r + bs, b)) for r in range(a, b, bs)]
    n_batches = {si: 0 for si, _ in todo}
    for si, _, _ in batches:
        n_batches[si] += 1
    w = _Writer(sdir, manifest, rows, n_batches)
    th = threading.Thread(target=w.run, name="mi-activation-writer", daemon=True)
    fin = threading.Thread(target=w.finish_all, name="mi-activation-finisher", daemon=True)
    th.start()
    fin.start()
    bar = Progress(manifest["tokens"], "cache activations", unit="tok", enabled=progress,
                   initial=manifest["tokens"] - sum(s["tokens"] for _, s in todo))
    try:
        payloads = ((i, (names, layouts, rows[r0:r1], dtypes))
                    for i, (_, r0, r1) in enumerate(batches))
        for i, ok, value in ex.run(_capture_task, payloads):
            si, r0, r1 = batches[i]
            if not ok:
                raise StoreError(f"{sdir.file(manifest['shards'][si]['file'])} (rows "
                                 f"{r0}..{r1}): capturing failed: {value}")
            if w.failure:
                break
            w.queue.put((si, r0, r1, value))
            bar.update((r1 - r0) * ctx)
    finally:
        w.queue.put(None)
        th.join()
        w.finished.put(None)
        fin.join()
        bar.close()
        for f in w.files.values():
            f.abort()
    if w.failure:
        raise w.failure[0]


def _capture_task(model: Any, payload: tuple[list[str], dict[str, str], torch.Tensor,
                                                dict[str, str]]) -> dict[str, torch.Tensor]:
    """Token-major activations of `rows` [b, context_len] at each hook, each in its store dtype."""
    hooks, layouts, rows, dtypes = payload
    cache = model.forward(rows, HookSpec().capture_all(hooks))
    return {h: _stored(h, cache.require(h), layouts[h], DTYPES[dtypes[h]]) for h in hooks}


# -- reading --------------------------------------------------------------------------------

class ActivationStore:
    """A store written by :func:`cache_activations`, read memory-mapped.

    ``store.hooks`` (name -> dtype, per-token shape), ``store.tokens``, ``store.shards``,
    ``store.complete``; :meth:`batches` iterates one hook's per-token activations;
    :meth:`tokens_of` the input ids aligned with them; :meth:`verify` checks every shard's
    content against its recorded sha256. The manifest is validated when the store is
    opened, each shard (size, header: index, token range, dtypes, shapes) when it is read;
    a disagreement is a StoreError naming the shard and the field.
    """

    report: CacheReport | None = None

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.directory = Path(out)
        with StoreDir(self.directory) as sdir:
            manifest = read_manifest(sdir)
        if manifest is None:
            raise StoreError(f"{self.directory}: no activation store here (manifest.json missing)")
        self.manifest = manifest
        self.hooks: dict[str, dict[str, Any]] = manifest["hooks"]
        self.context_len: int = manifest["context_len"]

    @property
    def shards(self) -> list[Path]:
        return [self.directory / s["file"] for s in self.manifest["shards"]]

    @property
    def complete(self) -> bool:
        with StoreDir(self.directory) as sdir:
            return all(sdir.is_file(s["file"]) for s in self.manifest["shards"])

    @property
    def tokens(self) -> int:
        return int(self.manifest["tokens"])

    def __len__(self) -> int:
        return self.tokens

    def _check(self, hook: str | HookPoint) -> str:
        name = HookPoint.parse(hook).name
        if name not in self.hooks and name != "tokens":
            raise HookError(f"hook point {name!r} is not in the store {self.directory} "
                            f"(it has {sorted(self.hooks)})")
        with StoreDir(self.directory) as sdir:
            missing = [s["file"] for s in self.manifest["shards"] if not sdir.is_file(s["file"])]
        if missing:
            raise StoreError(f"{self.directory}: the store is incomplete ({len(missing)} of "
                             f"{len(self.shards)} shards missing, e.g. {missing[0]}); re-run "
                             f"cache_activations to finish it")
        return name

    def shard_tensors(self, index: int) -> dict[str, torch.Tensor]:
        """All tensors of one shard, memory-mapped, after checking the shard against the
        manifest (size and header: StoreError naming the shard and the field)."""
        shards = self.manifest["shards"]
        if not -len(shards) <= index < len(shards):
            raise ConfigError(f"shard index {index} out of range: the store has {len(shards)}")
        with StoreDir(self.directory) as sdir:
            return map_shard(sdir, shards[index], self.hooks)

    def verify(self) -> None:
        """Check every shard in full: the manifest's size and header, and the sha256 of the
        whole file against the one recorded when it was written. StoreError naming the
        first shard and field that disagree (or the missing shard)."""
        self._check("tokens")
        with StoreDir(self.directory) as sdir:
            for s in self.manifest["shards"]:
                fd, _, _ = open_shard(sdir, s, self.hooks, full=True)
                os.close(fd)

    def tokens_of(self) -> torch.Tensor:
        """The input ids [tokens] (int32), aligned with every hook's activations."""
        self._check("tokens")
        return torch.cat([self.shard_tensors(i)["tokens"] for i in range(len(self.shards))])

    def batches(self, hook: str | HookPoint, batch_size: int = 4096, shuffle: bool = False,
                seed: int = 0, buffer_size: int | None = None, drop_last: bool = False
                ) -> Iterator[torch.Tensor]:
        """Per-token activations of `hook` in batches [batch_size, *per-token shape].

        Unshuffled: in store order (the last batch may be short unless `drop_last`).
        ``shuffle=True``: shards in a seeded random order stream through a buffer of
        `buffer_size` tokens (default ``max(16 * batch_size, 65536)``) from which each batch
        is drawn at random; every token appears exactly once per pass; only the buffer and
        the current shard's touched pages are in memory.
        """
        name = self._check(hook)
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        order = list(range(len(self.shards)))
        g = torch.Generator().manual_seed(int(seed))
        if shuffle:
            order = torch.randperm(len(order), generator=g).tolist()
        chunks = (self.shard_tensors(i)[name] for i in order)
        if not shuffle:
            yield from _rebatch(chunks, batch_size, drop_last)
            return
        size = buffer_size or max(16 * batch_size, 65536)
        if size < batch_size:
            raise ConfigError(f"buffer_size ({size}) must be >= batch_size ({batch_size})")
        yield from _shuffled(chunks, batch_size, size, g, drop_last)


def _rebatch(chunks: Iterable[torch.Tensor], batch_size: int, drop_last: bool
             ) -> Iterator[torch.Tensor]:
    carry: torch.Tensor | None = None
    for c in chunks:
        start = 0
        if carry is not None:
            need = batch_size - carry.shape[0]
            carry = torch.cat([carry, c[:need]])
            start = need
            if carry.shape[0] < batch_size:
                continue
            yield carry
            carry = None
        while start + batch_size <= c.shape[0]:
            yield c[start:start + batch_size].clone()
            start += batch_size
        if start < c.shape[0]:
            carry = c[start:].clone()
    if carry is not None and carry.shape[0] and not drop_last:
        yield carry


def _shuffled(chunks: Iterable[torch.Tensor], batch_size: int, buffer_size: int,
              g: torch.Generator, drop_last: bool) -> Iterator[torch.Tensor]:
    """A bounded shuffle buffer: incoming tokens replace the ones drawn out."""
    buf: torch.Tensor | None = None
    fill = 0
    for piece in _rebatch(chunks, batch_size, drop_last=False):
        if buf is None:  # room for one short last piece beyond the buffer proper
            buf = torch.empty((buffer_size + batch_size, *piece.shape[1:]), dtype=piece.dtype)
        n = piece.shape[0]
        if fill + n <= buffer_size or n < batch_size:
            buf[fill:fill + n] = piece
            fill += n
            continue
        idx = torch.randperm(fill, generator=g)[:n]
        out = buf[idx].clone()
        buf[idx] = piece  # the drawn slots take the incoming tokens
        yield out
    if buf is None:
        return
    rest = buf[:fill][torch.randperm(fill, generator=g)]
    for a in range(0, fill, batch_size):
        b = rest[a:a + batch_size]
        if b.shape[0] == batch_size or not drop_last:
            yield b
