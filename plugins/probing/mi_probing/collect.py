"""Activation collection for probing: one feature vector per prompt at each hook point.

Prompts are run in batches, right-padded with an ``attention_mask``. Right padding keeps
every real token at the position it has when the prompt runs alone, and causal attention
never lets a real token see the pads after it, so batched activations equal unbatched ones
on any backend. Features are reduced per prompt (last token, a token index, or the mean over
real tokens) and kept in memory, or streamed to safetensors shards on disk once they pass
``max_memory_bytes`` (or always, when ``out_dir`` is given).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import attrs
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mi_core.plugin import HookError, HookLike, HookPoint, HookSpec, MIModel, Progress
from mi_probing.errors import ProbingError

MANIFEST = "manifest.json"
FORMAT = "mi-probing-activations/1"


@attrs.frozen
class Position:
    """Which token(s) of a prompt give its feature vector.

    ``kind`` is ``"last"`` (last real token), ``"mean"`` (mean over real tokens, BOS
    included when the tokenizer adds one) or ``"index"`` (``index``-th real token; negative
    counts from the end, -1 = last).
    """

    kind: str = "last"
    index: int = -1

    @classmethod
    def parse(cls, value: "str | int | Position") -> "Position":
        if isinstance(value, Position):
            return value
        if isinstance(value, bool):
            raise ProbingError(f"position must be 'last', 'mean' or an integer, got {value!r}")
        if isinstance(value, int):
            return cls("index", value)
        text = str(value).strip()
        if text in ("last", "mean"):
            return cls(text, -1)
        try:
            return cls("index", int(text))
        except ValueError:
            raise ProbingError(f"position must be 'last', 'mean' or an integer, "
                               f"got {value!r}") from None

    def __str__(self) -> str:
        return self.kind if self.kind != "index" else str(self.index)

    def reduce(self, acts: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """acts [batch, seq, *feat] with right-padded mask [batch, seq] -> [batch, *feat]."""
        lengths = mask.sum(dim=1)  # [batch]
        if self.kind == "mean":
            m = mask.to(acts.dtype).reshape(*mask.shape, *([1] * (acts.dim() - 2)))
            return (acts * m).sum(dim=1) / lengths.to(acts.dtype).reshape(-1, *m.shape[2:])
        if self.kind == "last":
            idx = lengths - 1
        else:
            idx = torch.full_like(lengths, self.index) if self.index >= 0 else lengths + self.index
        rows = torch.arange(acts.shape[0], device=acts.device)
        return acts[rows, idx.to(acts.device)]


class _ShardWriter:
    """Buffers rows per hook and writes a safetensors shard every ``shard_bytes``."""

    def __init__(self, directory: Path, hooks: list[str], shard_bytes: int) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        if (self.dir / MANIFEST).exists():
            raise ProbingError(f"{self.dir}: already holds collected activations "
                               f"({MANIFEST}); choose an empty directory")
        self.hooks = hooks
        self.shard_bytes = shard_bytes
        self.buffer: dict[str, list[torch.Tensor]] = {h: [] for h in hooks}
        self.buffered = 0
        self.shards: list[dict[str, object]] = []

    def add(self, rows: dict[str, torch.Tensor]) -> None:
        for h in self.hooks:
            self.buffer[h].append(rows[h])
            self.buffered += rows[h].numel() * rows[h].element_size()
        if self.buffered >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.buffer[self.hooks[0]]:
            return
        tensors = {h: torch.cat(self.buffer[h]).contiguous() for h in self.hooks}
        name = f"shard_{len(self.shards):05d}.safetensors"
        save_file(tensors, str(self.dir / name))
        self.shards.append({"file": name, "rows": int(tensors[self.hooks[0]].shape[0])})
        self.buffer = {h: [] for h in self.hooks}
        self.buffered = 0


class ActivationSet:
    """Per-prompt features at each hook point: ``acts[hook] -> FloatTensor [n, features]``.

    Features of a point with shape [batch, seq, *feat] are flattened to ``prod(feat)``;
    ``feature_shapes[hook]`` keeps ``feat`` for turning probe weights back into model space.
    When streamed, :meth:`get` reads one hook's rows from the shards (memory: one hook).
    """

    def __init__(self, hooks: list[str], feature_shapes: dict[str, tuple[int, ...]],
                 position: Position, n: int, tensors: dict[str, torch.Tensor] | None = None,
                 directory: Path | None = None, shards: list[dict[str, object]] | None = None
                 ) -> None:
        self.hooks = hooks
        self.feature_shapes = feature_shapes
        self.position = position
        self.n = n
        self._tensors = tensors
        self.directory = directory
        self._shards = shards or []

    @property
    def on_disk(self) -> bool:
        return self._tensors is None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, hook: HookLike) -> torch.Tensor:
        return self.get(hook)

    def get(self, hook: HookLike) -> torch.Tensor:
        """FloatTensor [n, features] for `hook` (HookError if it was not collected)."""
        name = HookPoint.parse(hook).name
        if name not in self.feature_shapes:
            raise HookError(f"hook point {name!r} was not collected "
                            f"(collected: {', '.join(self.hooks)})")
        if self._tensors is not None:
            return self._tensors[name]
        assert self.directory is not None
        width = math.prod(self.feature_shapes[name])
        parts = []
        for shard in self._shards:
            f = self.directory / str(shard["file"])
            try:
                with safe_open(str(f), framework="pt") as fh:
                    t = fh.get_tensor(name)
            except Exception as exc:  # unreadable file, tensor not in the shard
                raise ProbingError(f"{f}: cannot read tensor {name!r}: {exc}") from None
            if tuple(t.shape) != (shard["rows"], width) or not t.is_floating_point():
                raise ProbingError(f"{f}: tensor {name!r} is {t.dtype} {list(t.shape)}, expected "
                                   f"float [{shard['rows']}, {width}] per {MANIFEST}")
            if not bool(torch.isfinite(t).all()):
                raise ProbingError(f"{f}: tensor {name!r} contains NaN or inf")
            parts.append(t)
        return torch.cat(parts)

    def save(self, directory: str | os.PathLike[str], shard_bytes: int = 64 << 20) -> Path:
        """Write shards + manifest to `directory` (a no-op when already stored there)."""
        d = Path(directory)
        if self.on_disk and self.directory is not None and d.resolve() == self.directory.resolve():
            return d
        writer = _ShardWriter(d, self.hooks, shard_bytes)
        for h in self.hooks:  # one hook at a time keeps the memory bounded
            writer.buffer[h] = [self.get(h)]
        writer.flush()
        _write_manifest(d, self.hooks, self.feature_shapes, self.position, self.n, writer.shards)
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> "ActivationSet":
        """Open activations written by :func:`collect_activations` or :meth:`save`.

        The manifest is checked strictly (ProbingError naming the file, key and value); each
        shard's tensors are checked when read (shape, float dtype, finite values).
        """
        d = Path(directory)
        path = d / MANIFEST
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ProbingError(f"{path}: not found; not a collected-activations "
                               "directory") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProbingError(f"{path}: invalid JSON: {exc}") from None
        hooks, shapes, position, n, shards = _parse_manifest(meta, path)
        missing = [s["file"] for s in shards if not (d / str(s["file"])).exists()]
        if missing:
            raise ProbingError(f"{d}: shard file(s) {missing} listed in {MANIFEST} are missing")
        return cls(hooks, shapes, position, n, directory=d, shards=shards)

    def __repr__(self) -> str:
        where = f"on disk at {self.directory}" if self.on_disk else "in memory"
        return f"ActivationSet(n={self.n}, hooks={self.hooks}, position={self.position}, {where})"


def _parse_manifest(meta: object, path: Path
                    ) -> tuple[list[str], dict[str, tuple[int, ...]], Position, int, list[dict[str, object]]]:
    """(hooks, feature shapes, position, n, shards) of a manifest, every value type-checked."""
    def bad(key: str, value: object, why: str) -> ProbingError:
        return ProbingError(f"{path}: key {key!r} = {value!r}: {why}")

    def count(key: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(key, value, "expected an integer >= 0")
        return value

    if not isinstance(meta, dict):
        raise ProbingError(f"{path}: must hold a JSON object, got {type(meta).__name__}")
    if meta.get("format") != FORMAT:
        raise bad("format", meta.get("format"), f"expected {FORMAT!r}")
    hooks = meta.get("hooks")
    if not isinstance(hooks, list) or not hooks or not all(isinstance(h, str) for h in hooks):
        raise bad("hooks", hooks, "expected a non-empty list of hook names")
    shapes = meta.get("feature_shapes")
    if not isinstance(shapes, dict) or sorted(shapes) != sorted(hooks):
        raise bad("feature_shapes", shapes, "expected an object with one shape per hook")
    for h, shape in shapes.items():
        if not isinstance(shape, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape):
            raise bad("feature_shapes", shapes, f"{h}: expected a list of positive integers")
    n = count("n", meta.get("n"))
    position = meta.get("position")
    if isinstance(position, bool) or not isinstance(position, (str, int)):
        raise bad("position", position, "expected 'last', 'mean' or an integer")
    shards = meta.get("shards")
    if not isinstance(shards, list):
        raise bad("shards", shards, "expected a list of {file, rows}")
    for i, sh in enumerate(shards):
        if not isinstance(sh, dict) or not isinstance(sh.get("file"), str):
            raise bad(f"shards[{i}]", sh, "expected {file, rows}")
        name = sh["file"]
        if Path(name).name != name or not name.endswith(".safetensors"):
            raise bad(f"shards[{i}].file", name, "expected a .safetensors file name in the "
                      "directory (other formats, e.g. pickles, are never opened)")
        count(f"shards[{i}].rows", sh.get("rows"))
    if sum(sh["rows"] for sh in shards) != n:
        raise bad("n", n, f"the shards hold {sum(sh['rows'] for sh in shards)} rows")
    return (list(hooks), {k: tuple(v) for k, v in shapes.items()}, Position.parse(position), n,
            shards)


def _write_manifest(d: Path, hooks: list[str], shapes: dict[str, tuple[int, ...]],
                    position: Position, n: int, shards: list[dict[str, object]]) -> None:
    meta = {"format": FORMAT, "hooks": hooks, "n": n, "position": str(position),
            "feature_shapes": {k: list(v) for k, v in shapes.items()}, "shards": shards}
    (d / MANIFEST).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def resolve_hooks(model: MIModel, hooks: Iterable[HookLike]) -> list[HookPoint]:
    """Canonical points, checked against the model before any compute (HookError names
    the missing point and the nearest valid names)."""
    points = [HookPoint.parse(h) for h in hooks]
    if not points:
        raise ProbingError("no hook points given")
    HookSpec().capture_all(points).validate(model.hook_points(), num_layers=model.num_layers)
    return list({p.name: p for p in points}.values())


def collect_activations(model: MIModel, texts: Sequence[str], hooks: Iterable[HookLike],
                        position: "str | int | Position" = "last", batch_size: int = 16,
                        *, out_dir: str | os.PathLike[str] | None = None,
                        max_memory_bytes: int = 256 << 20, shard_bytes: int = 64 << 20,
                        prepend_bos: bool | None = None, progress: bool | None = None
                        ) -> ActivationSet:
    """Run `texts` through `model` and keep one float32 feature vector per prompt per hook.

    Args:
        hooks: points whose activation is [batch, seq, *feat] (residual stream, MLP, ...).
        position: ``"last"``, ``"mean"`` or a token index into each prompt's real tokens.
        out_dir: stream to safetensors shards there (always). Without it, features stay in
            memory until they exceed `max_memory_bytes`, then go to a temporary directory
            (``ActivationSet.directory``; the caller may delete it).
        progress: show progress on stderr; None: as mi_core.plugin.set_progress says.

    Raises HookError for a point the model lacks, ProbingError for an index some prompt is
    too short for or a point without a [batch, seq, ...] layout.
    """
    pos = Position.parse(position)
    points = resolve_hooks(model, hooks)
    names = [p.name for p in points]
    texts = list(texts)
    if not texts:
        raise ProbingError("no prompts to collect activations for")
    if batch_size < 1:
        raise ProbingError(f"batch_size must be >= 1, got {batch_size}")
    spec = HookSpec().capture_all(points)
    tok = model.tokenizer
    pad_id = tok.eos_token_id if tok.eos_token_id is not None else 0

    in_memory: dict[str, list[torch.Tensor]] = {h: [] for h in names}
    held = 0
    writer = _ShardWriter(Path(out_dir), names, shard_bytes) if out_dir is not None else None
    shapes: dict[str, tuple[int, ...]] = {}
    bar = Progress(len(texts), "collecting activations", unit="prompt", enabled=progress)
    try:
        for start in range(0, len(texts), batch_size):
            chunk = texts[start:start + batch_size]
            ids, mask = model.to_tokens_padded(chunk, side="right", prepend_bos=prepend_bos,
                                               pad_id=pad_id)
            if pos.kind == "index":
                _check_index(pos.index, mask.sum(dim=1).tolist(), start)
            cache = model.forward(ids, spec, attention_mask=mask)
            rows: dict[str, torch.Tensor] = {}
            for h in names:
                acts = cache.require(h)
                if acts.dim() < 3 or tuple(acts.shape[:2]) != tuple(ids.shape):
                    raise ProbingError(
                        f"hook point {h!r} has shape {list(acts.shape)}, not [batch={ids.shape[0]},"
                        f" seq={ids.shape[1]}, ...]; probing needs one activation per token")
                shapes[h] = tuple(acts.shape[2:])
                feat = pos.reduce(acts.float(), mask.to(acts.device))
                rows[h] = feat.reshape(feat.shape[0], -1).detach().to("cpu", torch.float32)
            if writer is None:
                for h in names:
                    in_memory[h].append(rows[h])
                    held += rows[h].numel() * 4
                if held > max_memory_bytes:  # too big for memory: move to disk from here on
                    writer = _ShardWriter(Path(tempfile.mkdtemp(prefix="mi-probing-")), names,
                                          shard_bytes)
                    writer.add({h: torch.cat(in_memory[h]) for h in names})
                    in_memory = {h: [] for h in names}
            else:
                writer.add(rows)
            bar.update(len(chunk))
    finally:
        bar.close()
    if writer is None:
        return ActivationSet(names, shapes, pos, len(texts),
                             tensors={h: torch.cat(in_memory[h]) for h in names})
    writer.flush()
    _write_manifest(writer.dir, names, shapes, pos, len(texts), writer.shards)
    return ActivationSet(names, shapes, pos, len(texts), directory=writer.dir,
                         shards=writer.shards)


def _check_index(index: int, lengths: list[int], offset: int) -> None:
    for i, n in enumerate(lengths):
        if (index >= 0 and index >= n) or (index < 0 and -index > n):
            raise ProbingError(f"position {index} is outside prompt {offset + i}, which has "
                               f"{n} tokens")
