"""Labelled prompt datasets: ``{"text": ..., "label": ...}`` per JSONL line."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import attrs

from mi_probing.errors import ProbingError

Label = str | int | float | bool


def _check_label(value: Any, where: str) -> Label:
    if isinstance(value, bool) or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProbingError(f"{where}: label {value!r} is not finite")
        return value
    raise ProbingError(f"{where}: label must be a string, integer, float or boolean, "
                       f"got {type(value).__name__}")


@attrs.frozen
class LabelledDataset:
    """Prompts and one label each. Build with :meth:`from_lists` or :func:`load_jsonl`."""

    texts: tuple[str, ...]
    labels: tuple[Label, ...]
    source: str = "<memory>"

    @classmethod
    def from_lists(cls, texts: Sequence[str], labels: Sequence[Label],
                   source: str = "<memory>") -> "LabelledDataset":
        """Validate and wrap; ProbingError on different counts, empty or non-string texts."""
        texts, labels = list(texts), list(labels)
        if len(texts) != len(labels):
            raise ProbingError(f"{source}: {len(texts)} prompts but {len(labels)} labels; "
                               "each prompt needs exactly one label")
        if not texts:
            raise ProbingError(f"{source}: the dataset is empty")
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t:
                raise ProbingError(f"{source}: prompt {i} must be a non-empty string, "
                                   f"got {t!r}")
        checked = [_check_label(v, f"{source}: example {i}") for i, v in enumerate(labels)]
        kinds = {type(v) for v in checked}
        if str in kinds and len(kinds) > 1:
            raise ProbingError(f"{source}: labels mix strings with numbers "
                               f"({sorted(k.__name__ for k in kinds)})")
        return cls(tuple(texts), tuple(checked), source)

    def __len__(self) -> int:
        return len(self.texts)

    def classes(self) -> list[Label]:
        """The distinct labels, sorted (the order probe results and directions use)."""
        return sorted(set(self.labels), key=lambda v: (str(type(v)), v))

    def is_regression_target(self) -> bool:
        """True when labels are numbers with a non-integer among them (auto task choice)."""
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.labels) \
            and any(isinstance(v, float) and not float(v).is_integer() for v in self.labels)


def _lines(fh: Any, path: Path) -> Any:
    try:
        yield from fh
    except UnicodeDecodeError as exc:
        raise ProbingError(f"{path}: not UTF-8 text: {exc}") from None


def load_jsonl(path: str | os.PathLike[str], text_key: str = "text",
               label_key: str = "label") -> LabelledDataset:
    """Read one JSON object per non-blank line; ProbingError naming file and line on bad data."""
    p = Path(path)
    texts: list[str] = []
    labels: list[Label] = []
    try:
        fh = p.open(encoding="utf-8")
    except OSError as exc:  # missing file, a directory, no permission
        raise ProbingError(f"{p}: cannot open the dataset: {exc.strerror or exc}") from None
    with fh:
        for lineno, line in enumerate(_lines(fh, p), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ProbingError(f"{p}:{lineno}: invalid JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise ProbingError(f"{p}:{lineno}: expected an object with {text_key!r} and "
                                   f"{label_key!r}, got {type(obj).__name__}")
            missing = [k for k in (text_key, label_key) if k not in obj]
            if missing:
                raise ProbingError(f"{p}:{lineno}: missing key(s) {missing}")
            texts.append(obj[text_key])
            labels.append(obj[label_key])
    return LabelledDataset.from_lists(texts, labels, source=str(p))
