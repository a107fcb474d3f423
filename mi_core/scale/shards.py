"""The shards of an activation store and their validation.

A shard is a plain safetensors file, written at known offsets under a temporary name, then
fsynced and renamed. The manifest lists, for each shard: ``index``, ``file``, ``rows``,
``token_range``, ``tokens``, ``bytes`` (the file's size), ``header_sha256`` (of the
safetensors header, which holds every tensor's dtype and shape and, in ``__metadata__``, the
shard's index, token range and the sha256 of its input ids) and, once the shard is finished,
``sha256`` (of the whole file: ``sha256sum`` checks it too).

Every read checks the fast part (size and header checksum; on a mismatch the header is
compared field by field, so the error names the field: index, token range, dtype, shape,
size); :func:`verify_shard` with ``full=True`` also hashes the content.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import mmap
import os
import re
import struct
from typing import Any

import torch

from mi_core.scale._common import StoreError
from mi_core.scale._fs import StoreDir, oserror

FORMAT = "mi-core-activations"
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
              torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
_FROM_ST = {v: k for k, v in _ST_DTYPES.items()}
#: the dtypes a store holds, by name ("float32", ...)
DTYPES = {str(dt).removeprefix("torch."): dt for dt in _ST_DTYPES}
SHARD_NAME = re.compile(r"^shard-(\d{5,})\.safetensors$")
_HEADER_LIMIT = 1 << 24  # a shard header holds a few tensors: 16 MiB is far beyond any


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (the tensor must outlive the view)."""
    assert t.is_contiguous() and t.device.type == "cpu"
    if not t.numel():
        return memoryview(b"")
    return memoryview((ctypes.c_char * (t.numel() * t.element_size())).from_address(
        t.data_ptr())).cast("B")


def ids_sha256(ids: torch.Tensor) -> str:
    """sha256 of token ids as the shard stores them (int32, little-endian)."""
    flat = ids.reshape(-1).to(torch.int32).contiguous()  # alive while its bytes are hashed
    return hashlib.sha256(tensor_bytes(flat)).hexdigest()


# -- the planned header -------------------------------------------------------------------------

def shard_tensors_plan(hooks: dict[str, dict[str, Any]], tokens: int
                       ) -> dict[str, tuple[str, list[int], int]]:
    """name -> (safetensors dtype, shape, bytes) of one shard's tensors, in file order."""
    out = {h: (_ST_DTYPES[DTYPES[v["dtype"]]], [tokens] + list(v["shape"]),
               tokens * v["bytes_per_token"]) for h, v in hooks.items()}
    out["tokens"] = ("I32", [tokens], 4 * tokens)
    return out


def shard_metadata(entry: dict[str, Any], ids_hash: str) -> dict[str, str]:
    a, b = entry["token_range"]
    return {"format": FORMAT, "shard": str(entry["index"]), "token_range": f"{a}-{b}",
            "tokens_sha256": ids_hash}


def build_header(tensors: dict[str, tuple[str, list[int], int]], metadata: dict[str, str]
                 ) -> tuple[bytes, dict[str, int], int]:
    """(the 8-byte length + JSON header, name -> file offset of its data, file size)."""
    head: dict[str, Any] = {"__metadata__": metadata}
    offsets, pos = {}, 0
    for name, (dt, shape, nbytes) in tensors.items():
        head[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + nbytes]}
        offsets[name] = pos
        pos += nbytes
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    start = 8 + len(text)
    return (struct.pack("<Q", len(text)) + text, {k: v + start for k, v in offsets.items()},
            start + pos)


def plan_entry(index: int, rows: tuple[int, int], context_len: int,
               hooks: dict[str, dict[str, Any]], ids: torch.Tensor) -> dict[str, Any]:
    """The manifest entry of shard `index` holding `rows` (`ids`: those rows' token ids)."""
    a, b = rows
    entry: dict[str, Any] = {"index": index, "file": shard_name(index), "rows": [a, b],
                             "token_range": [a * context_len, b * context_len],
                             "tokens": (b - a) * context_len}
    header, _, size = build_header(shard_tensors_plan(hooks, entry["tokens"]),
                                   shard_metadata(entry, ids_sha256(ids)))
    entry.update(bytes=size, header_sha256=hashlib.sha256(header).hexdigest())
    return entry


# -- writing ------------------------------------------------------------------------------------

class ShardFile:
    """One shard being written: ``<file>.tmp`` (created new, never through a link), filled at
    known offsets, then :meth:`finish` fsyncs it, hashes it and renames it into place."""

    def __init__(self, sdir: StoreDir, entry: dict[str, Any],
                 tensors: dict[str, tuple[str, list[int], int]], metadata: dict[str, str],
                 n_batches: int) -> None:
        self.sdir, self.name = sdir, entry["file"]
        self.path = sdir.file(self.name)
        self.tmp = self.name + ".tmp"
        header, self.offsets, self.total = build_header(tensors, metadata)
        self.fd = sdir.create_fresh(self.tmp)
        self.left = n_batches
        os.pwrite(self.fd, header, 0)

    def write(self, name: str, token_offset: int, bytes_per_token: int, t: torch.Tensor) -> None:
        pos = self.offsets[name] + token_offset * bytes_per_token
        t = t.contiguous()  # kept alive while its bytes are written
        view = tensor_bytes(t)
        while view:
            n = os.pwrite(self.fd, view, pos)
            view, pos = view[n:], pos + n

    def finish(self) -> str:
        """fsync, close and rename into place; the sha256 of the file."""
        os.ftruncate(self.fd, self.total)  # no-op unless the last tensor was empty
        os.fsync(self.fd)
        digest = file_sha256(self.fd)
        os.close(self.fd)
        self.fd = -1
        self.sdir.replace(self.tmp, self.name)
        self.sdir.sync()
        return digest

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.sdir.unlink(self.tmp)


def file_sha256(fd: int) -> str:
    h = hashlib.sha256()
    pos = 0
    while True:
        b = os.pread(fd, 1 << 23, pos)
        if not b:
            return h.hexdigest()
        h.update(b)
        pos += len(b)


# -- reading and validation ---------------------------------------------------------------------

def _bad(sdir: StoreDir, entry: dict[str, Any], field: str, msg: str) -> StoreError:
    return StoreError(f"{sdir.file(entry['file'])} (shard {entry['index']}): {field}: {msg}; "
                      f"the shard does not belong here (re-run cache_activations after "
                      f"removing it, or overwrite=True)")


def read_header(fd: int, size: int) -> tuple[bytes, dict[str, Any]]:
    """(raw header bytes incl. the length prefix, parsed JSON); ValueError saying what is wrong."""
    if size < 8:
        raise ValueError(f"{size} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    if n > min(size - 8, _HEADER_LIMIT):
        raise ValueError(f"header length {n} beyond the file ({size} bytes)")
    raw = os.pread(fd, n, 8)
    head = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    if not isinstance(head, dict):
        raise ValueError("the header is not a JSON object")
    return struct.pack("<Q", n) + raw, head


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _compare(sdir: StoreDir, entry: dict[str, Any], hooks: dict[str, dict[str, Any]],
             head: dict[str, Any]) -> None:
    """StoreError naming the first field of `head` that disagrees with the manifest."""
    meta = head.get("__metadata__")
    meta = meta if isinstance(meta, dict) else {}
    a, b = entry["token_range"]
    if meta.get("format") != FORMAT:
        raise _bad(sdir, entry, "format", f"{meta.get('format')!r:.80}, expected {FORMAT!r}")
    if meta.get("shard") != str(entry["index"]):
        raise _bad(sdir, entry, "index", f"the file is shard {meta.get('shard')!r:.40}, the "
                   f"manifest expects shard {entry['index']} (shards swapped or renamed?)")
    if meta.get("token_range") != f"{a}-{b}":
        raise _bad(sdir, entry, "token range", f"the file holds tokens "
                   f"{meta.get('token_range')!r:.40}, the manifest expects {a}-{b}")
    want = shard_tensors_plan(hooks, entry["tokens"])
    extra = sorted(set(head) - set(want) - {"__metadata__"})
    if extra:
        raise _bad(sdir, entry, "tensors", f"unexpected tensor(s) {extra[:5]}")
    for name, (dt, shape, _) in want.items():
        got = head.get(name)
        if not isinstance(got, dict):
            raise _bad(sdir, entry, f"tensor {name!r}", "missing")
        if got.get("dtype") != dt:
            raise _bad(sdir, entry, f"dtype of {name!r}", f"{got.get('dtype')!r:.40}, the "
                       f"store holds {dt}")
        if got.get("shape") != shape:
            raise _bad(sdir, entry, f"shape of {name!r}", f"{got.get('shape')!r:.80}, expected "
                       f"{shape} ([tokens, *per-token shape])")
    if meta.get("tokens_sha256") is not None and not isinstance(meta.get("tokens_sha256"), str):
        raise _bad(sdir, entry, "tokens_sha256", "not a string")
    raise _bad(sdir, entry, "header checksum", "the header differs from the one planned "
               "(other input tokens, or other tensor offsets)")


def open_shard(sdir: StoreDir, entry: dict[str, Any], hooks: dict[str, dict[str, Any]],
               full: bool = False) -> tuple[int, int, dict[str, Any]]:
    """(descriptor, header length, parsed header) of a shard that passed the fast check (and
    the content hash with `full`); StoreError naming the shard and the field otherwise."""
    fd = sdir.open_read(entry["file"])
    try:
        size = os.fstat(fd).st_size
        try:
            raw, head = read_header(fd, size)
        except (ValueError, UnicodeDecodeError, struct.error) as exc:
            raise _bad(sdir, entry, "header", f"not a safetensors header ({exc})") from None
        if hashlib.sha256(raw).hexdigest() != entry["header_sha256"]:
            _compare(sdir, entry, hooks, head)
        if size != entry["bytes"]:
            raise _bad(sdir, entry, "size", f"{size} bytes, the manifest expects "
                       f"{entry['bytes']} ({'truncated' if size < entry['bytes'] else 'too long'})")
        if full:
            want = entry.get("sha256")
            if not isinstance(want, str):
                raise _bad(sdir, entry, "sha256", "no content checksum was recorded (re-run "
                           "cache_activations to record it)")
            if file_sha256(fd) != want:
                raise _bad(sdir, entry, "sha256", "the content differs from what was written")
        return fd, len(raw), head
    except OSError as exc:
        os.close(fd)
        raise oserror(exc, sdir.file(entry["file"]), "read") from None
    except BaseException:
        os.close(fd)
        raise


def map_shard(sdir: StoreDir, entry: dict[str, Any], hooks: dict[str, dict[str, Any]]
              ) -> dict[str, torch.Tensor]:
    """Every tensor of a validated shard as a view of a private (copy-on-write) memory map:
    pages are read from disk when touched."""
    fd, hlen, head = open_shard(sdir, entry, hooks)
    try:
        mm = mmap.mmap(fd, entry["bytes"], access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise oserror(exc, sdir.file(entry["file"]), "map") from None
    finally:
        os.close(fd)
    mapped = torch.frombuffer(mm, dtype=torch.uint8)  # the tensor keeps the map alive
    out = {}
    for name, (dt, shape, nbytes) in shard_tensors_plan(hooks, entry["tokens"]).items():
        a, b = head[name]["data_offsets"]
        if b - a != nbytes or not 0 <= hlen + a <= hlen + b <= entry["bytes"]:
            raise _bad(sdir, entry, f"data_offsets of {name!r}", f"[{a}, {b}] do not hold "
                       f"{nbytes} bytes inside the file")
        torch_dt = _FROM_ST[dt]
        if b == a:
            out[name] = torch.empty(shape, dtype=torch_dt)
            continue
        raw = mapped[hlen + a:hlen + b]
        if (hlen + a) % torch_dt.itemsize:  # a misaligned tensor (odd sizes before it): a copy
            raw = raw.clone()
        out[name] = raw.view(torch_dt).reshape(shape)
    return out


def dtype_bytes(name: str) -> int:
    return torch.tensor([], dtype=DTYPES[name]).element_size()


def per_token_bytes(shape: list[int], dtype: str) -> int:
    return math.prod(shape) * dtype_bytes(dtype)


# -- the manifest -------------------------------------------------------------------------------

def _need(cond: bool, where: str, key: str, msg: str) -> None:
    if not cond:
        raise StoreError(f"{where}: {key}: {msg}; not a valid activation store manifest")


def _is_int(v: Any, minimum: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _check_hooks(hooks: Any, where: str) -> None:
    _need(isinstance(hooks, dict) and bool(hooks), where, "hooks",
          f"expected an object of hook points, got {type(hooks).__name__}")
    for name, v in hooks.items():
        key = f"hooks[{name!r:.80}]"
        _need(isinstance(v, dict), where, key, "expected an object")
        _need(v.get("dtype") in DTYPES, where, key + ".dtype",
              f"{v.get('dtype')!r:.40} is not one of {sorted(DTYPES)}")
        shape = v.get("shape")
        _need(isinstance(shape, list) and all(_is_int(d) for d in shape), where, key + ".shape",
              f"{shape!r:.80} is not a list of non-negative integers")
        _need(v.get("bytes_per_token") == per_token_bytes(shape, v["dtype"]), where,
              key + ".bytes_per_token", f"{v.get('bytes_per_token')!r:.40} does not match "
              f"shape {shape} and dtype {v['dtype']}")
        _need(v.get("layout") in ("token", "query"), where, key + ".layout",
              f"{v.get('layout')!r:.40} is not 'token' or 'query'")


def _check_shards(data: dict[str, Any], where: str) -> None:
    shards, ctx = data.get("shards"), data["context_len"]
    _need(isinstance(shards, list), where, "shards",
          f"expected a list, got {type(shards).__name__}")
    end = 0
    for i, s in enumerate(shards):
        key = f"shards[{i}]"
        _need(isinstance(s, dict), where, key, "expected an object")
        _need(s.get("index") == i, where, key + ".index", f"{s.get('index')!r:.40}, expected {i}")
        _need(s.get("file") == shard_name(i), where, key + ".file",
              f"{s.get('file')!r:.80}, expected {shard_name(i)!r}")
        rows = s.get("rows")
        _need(isinstance(rows, list) and len(rows) == 2 and all(_is_int(r) for r in rows)
              and rows[0] == end and rows[1] > end, where, key + ".rows",
              f"{rows!r:.80}, expected [{end}, end > {end}] (shards cover the rows in order)")
        end = rows[1]
        _need(s.get("token_range") == [rows[0] * ctx, rows[1] * ctx], where,
              key + ".token_range", f"{s.get('token_range')!r:.80}, expected "
              f"{[rows[0] * ctx, rows[1] * ctx]}")
        _need(s.get("tokens") == (rows[1] - rows[0]) * ctx, where, key + ".tokens",
              f"{s.get('tokens')!r:.40}, expected {(rows[1] - rows[0]) * ctx}")
        _need(_is_int(s.get("bytes"), 8), where, key + ".bytes", f"{s.get('bytes')!r:.40}")
        for f in ("header_sha256", "sha256"):
            v = s.get(f)
            _need((v is None and f == "sha256") or (isinstance(v, str) and len(v) == 64),
                  where, f"{key}.{f}", f"{v!r:.80} is not a sha256")
    _need(end == data["rows"], where, "shards", f"they cover {end} rows, the store has "
          f"{data['rows']}")


def validate_manifest(data: Any, where: str, format_version: int) -> dict[str, Any]:
    """`data` if it is an activation store manifest of this format, else StoreError naming
    `where` (the manifest's path) and the key."""
    _need(isinstance(data, dict), where, "the manifest",
          f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT or data.get("format_version") != format_version:
        raise StoreError(f"{where}: not an activation store of format {FORMAT} version "
                         f"{format_version} (found {data.get('format')!r:.60} version "
                         f"{data.get('format_version')!r:.20}, written by mi-core "
                         f"{data.get('mi_core_version')!r:.20}); use a new directory or "
                         f"overwrite=True")
    for key in ("context_len", "batch_size", "rows_per_shard"):
        _need(_is_int(data.get(key), 1), where, key, f"{data.get(key)!r:.40} is not an "
              f"integer >= 1")
    for key in ("rows", "tokens", "tokens_dropped", "planned_bytes"):
        _need(_is_int(data.get(key)), where, key, f"{data.get(key)!r:.40} is not an "
              f"integer >= 0")
    _need(data["tokens"] == data["rows"] * data["context_len"], where, "tokens",
          f"{data['tokens']} != rows x context_len")
    for key in ("mi_core_version", "inputs_hash"):
        _need(isinstance(data.get(key), str), where, key, "expected a string")
    model = data.get("model")
    _need(isinstance(model, dict) and all(isinstance(model.get(k), str)
                                          for k in ("source", "fingerprint")),
          where, "model", "expected an object with string source and fingerprint")
    _check_hooks(data.get("hooks"), where)
    _check_shards(data, where)
    return data
