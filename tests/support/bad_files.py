"""Builders of malformed files for the bad-input tests: raw safetensors with any header, a
pickle whose unpickling would create a marker file, a tiny word-level tokenizer."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path
from typing import Any


def write_raw_safetensors(path: Path, header: Any, data: bytes = b"", header_bytes: bytes | None = None,
                          declared_len: int | None = None) -> Path:
    """A file laid out as safetensors (u64 header length, JSON header, data) with `header`
    serialised as given (any JSON value), or raw `header_bytes`; `declared_len` overrides the
    length field."""
    raw = header_bytes if header_bytes is not None else json.dumps(header).encode()
    n = len(raw) if declared_len is None else declared_len
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


class _CreatesMarker:
    """Unpickling this calls ``open(marker, "w")``: proof that something was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.marker, "w"))


def write_pickle_payload(path: Path, marker: Path) -> Path:
    """A pickle file that would create `marker` if anything ever unpickled it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(_CreatesMarker(marker)))
    return path


def write_word_tokenizer(directory: Path, tokenizer_config: Any = None,
                         config_text: str | None = None) -> Path:
    """tokenizer.json of a WordLevel tokenizer (vocabulary <unk>, <s>, </s>, a, b, c), plus
    tokenizer_config.json holding `tokenizer_config` (JSON) or the raw `config_text`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4, "c": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    if config_text is not None:
        (directory / "tokenizer_config.json").write_text(config_text)
    elif tokenizer_config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return directory / "tokenizer.json"
