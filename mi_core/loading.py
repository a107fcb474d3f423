"""Source resolution (hub id / directory / single file) and safetensors helpers.

Nothing here unpickles: weights come from safetensors (memory-mapped) or from formats a
plugin parses itself (GGUF, NPZ with ``allow_pickle=False``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from safetensors import safe_open

from mi_core.errors import ConfigError, WeightLoadError

#: Files a hub download of a model fetches by default; plugins add more via a hook.
DEFAULT_HUB_PATTERNS = [
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
]


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
    branch, tag or commit of a hub repository, e.g. Pythia's ``"step1000"``) selects that
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


def read_json(path: Path, what: str = "config") -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what} file {path} not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} file {path} must hold a JSON object")
    return data


def read_config(directory: Path) -> dict[str, Any] | None:
    p = directory / "config.json"
    return read_json(p) if p.exists() else None


def require_field(config: Mapping[str, Any], key: str, source: str = "config.json") -> Any:
    """config[key], or a ConfigError naming the field and the file."""
    if key not in config or config[key] is None:
        raise ConfigError(f"{source}: required field {key!r} is missing")
    return config[key]


def safetensors_header(path: Path) -> dict[str, Any]:
    """Parse a safetensors header without reading tensor data; truncation is detected."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise WeightLoadError(f"{path}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8:
                raise WeightLoadError(f"{path}: truncated safetensors file (header length {n})")
            header = json.loads(f.read(n))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WeightLoadError(f"{path}: unreadable safetensors header: {exc}") from exc
    _check_header(header, path)
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise WeightLoadError(f"{path}: truncated safetensors file: header declares "
                              f"{8 + n + end} bytes, file has {size}")
    return header


def _is_uint(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_header(header: Any, path: Path) -> None:
    """The header's JSON shape: {name: {"dtype": str, "shape": [uint...], "data_offsets":
    [begin, end]}} plus an optional "__metadata__" {str: str}; anything else is a
    WeightLoadError naming the file and the entry (never a KeyError / TypeError later)."""
    if not isinstance(header, dict):
        raise WeightLoadError(f"{path}: safetensors header must be a JSON object, got "
                              f"{type(header).__name__}")
    for name, v in header.items():
        if name == "__metadata__":
            if not (isinstance(v, dict) and all(isinstance(x, str) for x in v.values())):
                raise WeightLoadError(f"{path}: safetensors __metadata__ must map strings to "
                                      f"strings, got {v!r:.80}")
            continue
        ok = (isinstance(v, dict) and isinstance(v.get("dtype"), str)
              and isinstance(v.get("shape"), list) and all(map(_is_uint, v["shape"]))
              and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2
              and all(map(_is_uint, v["data_offsets"]))
              and v["data_offsets"][0] <= v["data_offsets"][1])
        if not ok:
            raise WeightLoadError(f"{path}: safetensors header entry for tensor {name!r} is "
                                  f"malformed (needs dtype, shape [ints >= 0] and data_offsets "
                                  f"[begin <= end]): {v!r:.120}")


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
                self._where[name] = f
                self.shapes[name] = tuple(meta["shape"])
        self._handles: dict[Path, Any] = {}

    @classmethod
    def from_directory(cls, directory: Path) -> "SafetensorsCheckpoint":
        index = sorted(directory.glob("*.safetensors.index.json"))
        if index:
            data = read_json(index[0], "safetensors index")
            names = sorted(set(data.get("weight_map", {}).values()))
            files = [directory / n for n in names]
            missing = [str(f) for f in files if not f.exists()]
            if missing:
                raise WeightLoadError(f"{index[0]}: shard files missing: {', '.join(missing)}")
            return cls(files)
        files = sorted(directory.glob("*.safetensors"))
        if not files:
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
        return checked_tensor(t, name, str(f), dtype, device) if check else \
            t.to(dtype=dtype or t.dtype, device=device or t.device)

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
    """Tensor names and shapes of the safetensors in `directory` (headers only); empty if none."""
    try:
        ckpt = SafetensorsCheckpoint.from_directory(directory)
    except WeightLoadError:
        return [], {}
    return ckpt.names(), dict(ckpt.shapes)
