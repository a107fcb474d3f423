"""Source resolution (hub id / directory / single file) and safetensors helpers.

Nothing here unpickles: weights come from safetensors (memory-mapped) or from formats a
plugin parses itself (e.g. NPZ with ``allow_pickle=False``). A pickle-based checkpoint
(``pytorch_model.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``) is refused without being opened.
Every header is validated before use: a malformed file is a WeightLoadError / ConfigError
naming it, never a raw ValueError / KeyError / TypeError.
"""

from __future__ import annotations

import contextvars
import ctypes
import json
import mmap
import os
import struct
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from safetensors import safe_open

from mi_core.errors import ConfigError, MIError, WeightLoadError

#: Files a hub download of a model fetches by default; plugins add more via a hook.
DEFAULT_HUB_PATTERNS = [
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
]


MEMORY_CHECK_ENV = "MI_SKIP_MEMORY_CHECK"  #: =1: no memory checks (one load: check_memory=False)
SKIP_MEMORY_CHECK = contextvars.ContextVar("mi_skip_memory_check", default=False)


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes still allocatable: a CUDA device's free memory and torch's unused cache, else RAM
    (MemAvailable + SwapFree, or free pages); None where unknown (meta, xpu)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return (torch.cuda.mem_get_info(dev)[0] + torch.cuda.memory_reserved(dev)
                - torch.cuda.memory_allocated(dev))
    if dev.type not in ("cpu", "mps"):
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)}
        return (info["MemAvailable"] + info.get("SwapFree", 0)) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_memory(what: str, n_bytes: int, device: torch.device | str | None = None, *,
                 error: type[MIError] = ConfigError) -> None:
    """`error` naming `what` when `n_bytes`, estimated before allocating, cannot fit on
    `device` (None: on any device here; GPUs are asked only when RAM is short)."""
    if SKIP_MEMORY_CHECK.get() or os.environ.get(MEMORY_CHECK_ENV, "") not in ("", "0"):
        return
    free = available_memory(device or "cpu")
    if device is None and free is not None and n_bytes > free and torch.cuda.is_available():
        free = max(free, *(available_memory(f"cuda:{i}") or 0
                           for i in range(torch.cuda.device_count())))
    if free is not None and n_bytes > free:
        raise error(f"{what}: about {n_bytes / 2**30:,.3g} GiB, more than the "
                    f"{free / 2**30:,.3g} GiB available on {device or 'any device here'}; "
                    f"refused before allocating ({MEMORY_CHECK_ENV}=1, or check_memory=False "
                    f"for from_pretrained, to try anyway)")


def looks_like_hub_id(source: str) -> bool:
    """``org/name``, or ``org/name/sub/folder`` for a folder inside a hub repository."""
    p = Path(source)
    if p.exists() or source.startswith((".", "/", "~")) or os.sep + os.sep in source:
        return False
    parts = source.split("/")
    return len(parts) >= 2 and all(parts)


def resolve_source(source: str | os.PathLike[str], patterns: Iterable[str] | None = None,
                   revision: str | None = None) -> Path:
    """A local directory or file as-is; a hub id through ``huggingface_hub.snapshot_download``.

    ``org/name/sub/folder`` fetches and returns that folder of the repository.

    Only files matching `patterns` are fetched; the HF cache is reused; progress bars are
    huggingface_hub's own; ``HF_HUB_OFFLINE=1`` serves from the cache only. `revision` (a
    branch, tag or commit of a hub repository, e.g. a training checkpoint's ``"step1000"``) selects that
    snapshot; a revision that does not exist is a ConfigError naming it.
    """
    s = os.fspath(source)
    p = Path(s).expanduser()
    if revision is not None and (not isinstance(revision, str) or not revision):
        raise ConfigError(f"revision must be a non-empty string (branch, tag or commit), "
                          f"got {revision!r}")
    if p.exists():
        if revision is not None:
            raise ConfigError(f"revision={revision!r} was given for the local path {s!r}; "
                              f"revisions select hub snapshots only")
        return p
    if not looks_like_hub_id(s):
        raise ConfigError(f"model source {s!r} is neither an existing path nor a hub id")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    parts = s.split("/")
    repo_id, sub = "/".join(parts[:2]), "/".join(parts[2:])
    allow = list(patterns or DEFAULT_HUB_PATTERNS)
    if sub:  # only the files of that folder (SAE releases keep one SAE per folder)
        allow = [f"{sub}/{p}" for p in allow] + [f"{sub}/**/{p}" for p in allow]
    from huggingface_hub.errors import RevisionNotFoundError

    at = f" at revision {revision!r}" if revision is not None else ""
    try:
        path = snapshot_download(repo_id=repo_id, revision=revision, allow_patterns=allow)
    except RevisionNotFoundError as exc:
        raise ConfigError(f"hub repository {repo_id!r} has no revision {revision!r}: "
                          f"{exc}") from exc
    except LocalEntryNotFoundError as exc:
        raise ConfigError(f"hub id {s!r}{at} is not in the local HF cache and the hub cannot be "
                          f"reached (offline?): {exc}") from exc
    except Exception as exc:  # network errors, missing repos, ...
        raise ConfigError(f"could not fetch {s!r}{at} from the hub: {exc}") from exc
    local = Path(path) / sub
    if not local.exists():
        raise ConfigError(f"hub repository {repo_id!r} has no folder {sub!r}")
    return local


#: Suffixes of pickle-based checkpoints: refused, never opened (unpickling runs code).
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _config_constant(name: str) -> Any:
    """A config's bare ``Infinity`` (transformers 4's JSON of an infinite float) read as
    transformers 5 writes it, ``{"__float__": "Infinity"}``: only readers of that accept it."""
    if name == "Infinity":
        return {"__float__": "Infinity"}
    return _no_constant(name)


def read_json(path: Path, what: str = "config", *, infinity: bool = False) -> dict[str, Any]:
    """A JSON object from `path`; ConfigError naming the file for anything else (missing,
    unreadable, not UTF-8, invalid JSON, NaN / Infinity literals, not an object). `infinity`
    (a model's config.json): a bare ``Infinity`` is read as ``{"__float__": "Infinity"}``."""
    constant = _config_constant if infinity else _no_constant
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f, parse_constant=constant)
    except FileNotFoundError:
        raise ConfigError(f"{what} file {path} not found") from None
    except (json.JSONDecodeError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ConfigError(f"{what} file {path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{what} file {path} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} file {path} must hold a JSON object, got "
                          f"{type(data).__name__}")
    return data


def refuse_pickle(path: Path) -> None:
    """WeightLoadError if `path` (a file, or a directory without safetensors) is a
    pickle-based checkpoint. Only names are looked at: the files are never opened."""
    if path.is_file():
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise WeightLoadError(f"{path}: pickle-based checkpoints are refused (loading one "
                                  f"can run arbitrary code); convert it to safetensors")
        return
    if not path.is_dir() or any(path.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in path.iterdir()
                     if p.is_file() and p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise WeightLoadError(f"{path}: only pickle-based weights ({', '.join(pickles[:5])}); "
                              f"they are refused (loading one can run arbitrary code): convert "
                              f"them to safetensors")


def read_config(directory: Path) -> dict[str, Any] | None:
    p = directory / "config.json"
    return read_json(p, infinity=True) if p.exists() else None


def require_field(config: Mapping[str, Any], key: str, source: str = "config.json") -> Any:
    """config[key], or a ConfigError naming the field and the file."""
    if key not in config or config[key] is None:
        raise ConfigError(f"{source}: required field {key!r} is missing")
    return config[key]


#: Bytes per element of each safetensors dtype.
SAFETENSORS_DTYPES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}
_MAX_HEADER = 100_000_000  # the safetensors format's own limit


def safetensors_header(path: Path) -> dict[str, Any]:
    """Parse and validate a safetensors header without reading tensor data.

    Checked: the header is a JSON object of tensor entries (plus an optional string-valued
    ``__metadata__``); each has a known dtype, a shape of non-negative ints and
    ``data_offsets`` [begin, end] of exactly shape x dtype bytes; the tensors do not overlap
    and lie inside the file (truncation). Anything else is a WeightLoadError naming the file
    (and the tensor).
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise WeightLoadError(f"{path}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8 or n > _MAX_HEADER:
                raise WeightLoadError(f"{path}: truncated or corrupt safetensors file (header "
                                      f"length {n}, file size {size})")
            header = json.loads(f.read(n), parse_constant=_no_constant)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise WeightLoadError(f"{path}: unreadable safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise WeightLoadError(f"{path}: safetensors header must be a JSON object, got "
                              f"{type(header).__name__}")
    spans = []
    for name, meta in header.items():
        if name == "__metadata__":
            if not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
                raise WeightLoadError(f"{path}: __metadata__ must map strings to strings")
            continue
        spans.append((*_entry_span(path, name, meta), name))
    data_size = size - 8 - n
    prev_end, prev_name = 0, ""
    for begin, end, name in sorted(spans):
        if begin < prev_end:
            raise WeightLoadError(f"{path}: tensor {name!r} (bytes {begin}..{end}) overlaps "
                                  f"tensor {prev_name!r}")
        prev_end, prev_name = end, name
    if prev_end > data_size:
        raise WeightLoadError(f"{path}: truncated safetensors file: tensor {prev_name!r} ends at "
                              f"byte {prev_end} of the data, the file holds {data_size}")
    return header


def _entry_span(path: Path, name: str, meta: Any) -> tuple[int, int]:
    """(begin, end) of a validated header entry; WeightLoadError naming the tensor otherwise."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(meta, dict) or not {"dtype", "shape", "data_offsets"} <= set(meta):
        raise WeightLoadError(f"{where}: header entry must be an object with dtype, shape and "
                              f"data_offsets, got {str(meta)[:80]}")
    dtype, shape, offsets = meta["dtype"], meta["shape"], meta["data_offsets"]
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise WeightLoadError(f"{where}: unknown dtype {dtype!r} (known: "
                              f"{', '.join(SAFETENSORS_DTYPES)})")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise WeightLoadError(f"{where}: shape must be a list of non-negative ints, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))
            and offsets[0] <= offsets[1]):
        raise WeightLoadError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= "
                              f"end, got {offsets!r}")
    numel = 1
    for d in shape:
        numel *= d
    if offsets[1] - offsets[0] != numel * SAFETENSORS_DTYPES[dtype]:
        raise WeightLoadError(f"{where}: data_offsets {offsets} span {offsets[1] - offsets[0]} "
                              f"bytes; shape {shape} of {dtype} needs "
                              f"{numel * SAFETENSORS_DTYPES[dtype]}")
    return offsets[0], offsets[1]


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
def checked_tensor(t: torch.Tensor, name: str, origin: str, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """`t` cast to `dtype`/`device`, refusing what would silently give wrong numbers.

    An integer or bool tensor (weights outside a quantised format: a cast would keep the
    integers as if they were the real values) and a tensor with NaN/inf values (checked
    after the cast, so an F32 value too large for F16 is caught too) are a WeightLoadError
    naming the tensor and `origin`. The check reads each tensor once (memory-mapped data
    stays mapped); its cost is in docs/PERFORMANCE.md.
    """
    if not (t.dtype.is_floating_point or t.dtype.is_complex):
        raise WeightLoadError(f"{origin}: tensor {name!r} has integer dtype {t.dtype}; weights "
                              f"must be floating point (quantised checkpoints need their own "
                              f"format, e.g. GGUF)")
    if dtype is not None or device is not None:
        t = t.to(dtype=dtype or t.dtype, device=device or t.device)
    # A sum is NaN/inf whenever an entry is (one vectorised pass, ~30x faster than
    # isfinite().all()); only then, or if the sum itself overflowed, look entry by entry.
    if not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise WeightLoadError(f"{origin}: NaN or inf values (in {t.dtype}): {name} "
                              f"({bad} of {t.numel()} entries)")
    return t


def _drop_pages(t: torch.Tensor) -> None:
    """Drop the resident pages wholly inside memory-mapped `t` (madvise MADV_DONTNEED), so a
    load that casts holds one copy of the weights, not the cast one plus the file's pages.
    The pages are clean and file-backed: a later read faults them in again."""
    page = mmap.PAGESIZE
    start = -(-t.data_ptr() // page) * page
    end = (t.data_ptr() + t.numel() * t.element_size()) // page * page
    if end > start and _LIBC is not None:
        _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 4)  # DONTNEED


_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None


class SafetensorsCheckpoint:
    """One or more safetensors files (single or sharded via ``*.index.json``), read lazily.

    Tensors are memory-mapped by safetensors; :meth:`get` converts dtype/device only when
    needed, so peak memory stays near the weights' own size.
    """

    def __init__(self, files: list[Path]) -> None:
        if not files:
            raise WeightLoadError("no safetensors files given")
        self.files = files
        self._where: dict[str, Path] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for f in files:
            for name, meta in safetensors_header(f).items():
                if name == "__metadata__":
                    continue
                if name in self._where:
                    raise WeightLoadError(f"tensor {name!r} is in both {self._where[name]} and {f}")
                self._where[name] = f
                self.shapes[name] = tuple(meta["shape"])
        self._handles: dict[Path, Any] = {}

    @classmethod
    def from_directory(cls, directory: Path) -> "SafetensorsCheckpoint":
        index = sorted(directory.glob("*.safetensors.index.json"))
        if index:
            data = read_json(index[0], "safetensors index")
            wmap = data.get("weight_map", {})
            if not isinstance(wmap, dict) or not all(
                    isinstance(v, str) and v and Path(v).name == v for v in wmap.values()):
                raise WeightLoadError(f"{index[0]}: weight_map must map tensor names to shard "
                                      f"file names in the same directory")
            names = sorted(set(wmap.values()))
            files = [directory / n for n in names]
            missing = [str(f) for f in files if not f.exists()]
            if missing:
                raise WeightLoadError(f"{index[0]}: shard files missing: {', '.join(missing)}")
            return cls(files)
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            refuse_pickle(directory)
            raise WeightLoadError(f"{directory}: no *.safetensors files found")
        return cls(files)

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def _handle(self, f: Path) -> Any:
        h = self._handles.get(f)
        if h is None:
            try:
                h = safe_open(str(f), framework="pt")
            except Exception as exc:
                raise WeightLoadError(f"{f}: cannot open safetensors file: {exc}") from exc
            self._handles[f] = h
        return h

    def get(self, name: str, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None,
            shape: tuple[int, ...] | None = None, check: bool = True) -> torch.Tensor:
        """Load one tensor; `shape` is checked (WeightLoadError names the tensor and file).

        `check`: refuse integer/bool tensors and NaN/inf values (:func:`checked_tensor`);
        pass False only for tensors that are integer by design (e.g. buffers of indices)."""
        f = self._where.get(name)
        if f is None:
            raise WeightLoadError(f"tensor {name!r} not found in {', '.join(map(str, self.files))}")
        if shape is not None and tuple(self.shapes[name]) != tuple(shape):
            raise WeightLoadError(f"{f}: tensor {name!r} has shape {list(self.shapes[name])}, "
                                  f"expected {list(shape)}")
        try:
            t = self._handle(f).get_tensor(name)
        except Exception as exc:
            raise WeightLoadError(f"{f}: cannot read tensor {name!r}: {exc}") from exc
        out = checked_tensor(t, name, str(f), dtype, device) if check else \
            t.to(dtype=dtype or t.dtype, device=device or t.device)
        if out.data_ptr() != t.data_ptr() and t.device.type == "cpu":
            _drop_pages(t)  # a cast copy: the mapped pages are not needed again
        return out

    def check(self, expected: Mapping[str, tuple[int, ...]], optional: Iterable[str] = ()) -> None:
        """Raise one WeightLoadError listing every missing and every mis-shaped tensor."""
        opt = set(optional)
        missing = [n for n in expected if n not in self._where and n not in opt]
        wrong = [f"{n}: {list(self.shapes[n])} != expected {list(s)}"
                 for n, s in expected.items() if n in self._where and tuple(self.shapes[n]) != tuple(s)]
        if missing or wrong:
            parts = []
            if missing:
                parts.append("missing tensors: " + ", ".join(missing))
            if wrong:
                parts.append("mis-shaped tensors: " + "; ".join(wrong))
            raise WeightLoadError(f"{', '.join(map(str, self.files))}: " + " | ".join(parts))


def tensor_names_of(directory: Path) -> tuple[list[str], dict[str, tuple[int, ...]]]:
    """Tensor names and shapes of the safetensors in `directory` (headers only); empty if it
    has none. A malformed or truncated file is a WeightLoadError naming it (not "no tensors")."""
    if not any(directory.glob("*.safetensors")) and not any(
            directory.glob("*.safetensors.index.json")):
        return [], {}
    ckpt = SafetensorsCheckpoint.from_directory(directory)
    return ckpt.names(), dict(ckpt.shapes)
