"""The tokenizer protocol and its implementation over HuggingFace `tokenizers`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import attrs

from mi_core.errors import TokenizerError


@attrs.define
class EncodingWithOffsets:
    """Token ids with their character spans in the input text (end exclusive)."""

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]


@runtime_checkable
class MITokenizer(Protocol):
    """What mi-core needs of a tokenizer. Plugins' own tokenizers implement it too."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_with_offsets(self, text: str, add_special_tokens: bool = True) -> EncodingWithOffsets: ...

    def to_str_tokens(self, text_or_ids: str | Sequence[int]) -> list[str]: ...


class HFTokenizer:
    """MITokenizer over a ``tokenizer.json`` (the `tokenizers` library)."""

    def __init__(self, tokenizer: "object", bos_token: str | None = None,
                 eos_token: str | None = None, source: str = "<memory>") -> None:
        from tokenizers import Tokenizer

        if not isinstance(tokenizer, Tokenizer):
            raise TokenizerError(f"{source}: not a tokenizers.Tokenizer")
        self._tok = tokenizer
        self.source = source
        self._bos = self._tok.token_to_id(bos_token) if bos_token else None
        self._eos = self._tok.token_to_id(eos_token) if eos_token else None

    @classmethod
    def from_file(cls, path: Path) -> "HFTokenizer":
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise TokenizerError(f"{path}: cannot load tokenizer: {exc}") from exc
        bos = eos = None
        cfg = path.parent / "tokenizer_config.json"
        if cfg.exists():
            try:
                data = json.loads(cfg.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise TokenizerError(f"{cfg}: invalid JSON: {exc}") from exc
            bos, eos = _token_str(data.get("bos_token")), _token_str(data.get("eos_token"))
        return cls(tok, bos, eos, source=str(path))

    @classmethod
    def from_directory(cls, directory: Path) -> "HFTokenizer | None":
        p = directory / "tokenizer.json"
        return cls.from_file(p) if p.exists() else None

    @property
    def inner(self) -> "object":
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def bos_token_id(self) -> int | None:
        return self._bos

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise TokenizerError(f"{self.source}: token ids {bad[:5]} out of range [0, {n})")
        return self._tok.decode(ids, skip_special_tokens=False)

    def encode_with_offsets(self, text: str, add_special_tokens: bool = True) -> EncodingWithOffsets:
        enc = self._tok.encode(text, add_special_tokens=add_special_tokens)
        return EncodingWithOffsets(list(enc.ids), list(enc.tokens),
                                   [tuple(o) for o in enc.offsets])

    def to_str_tokens(self, text_or_ids: str | Sequence[int]) -> list[str]:
        ids = self.encode(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
        return [self.decode([i]) for i in ids]


def _token_str(tok: object) -> str | None:
    if isinstance(tok, str):
        return tok
    if isinstance(tok, dict) and isinstance(tok.get("content"), str):
        return tok["content"]
    return None
