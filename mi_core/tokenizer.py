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
        self._bos = self._special_id(bos_token, "bos_token")
        self._eos = self._special_id(eos_token, "eos_token")

    def _special_id(self, token: str | None, key: str) -> int | None:
        if not token:
            return None
        i = self._tok.token_to_id(token)
        if i is None:  # a BOS/EOS the vocabulary lacks would silently never be added / matched
            raise TokenizerError(f"{self.source}: {key} {token!r} is not in the vocabulary")
        return int(i)

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
            except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
                raise TokenizerError(f"{cfg}: invalid JSON: {exc}") from exc
            if not isinstance(data, dict):
                raise TokenizerError(f"{cfg}: must hold a JSON object, got {type(data).__name__}")
            bos = _token_str(data.get("bos_token"), cfg, "bos_token")
            eos = _token_str(data.get("eos_token"), cfg, "eos_token")
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
        if not isinstance(text, str):
            raise TokenizerError(f"{self.source}: encode needs a str, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        if isinstance(ids, (str, bytes)) or any(isinstance(i, (bool, float)) for i in ids):
            raise TokenizerError(f"{self.source}: decode needs integer token ids, got {ids!r:.60}")
        try:
            ids = [int(i) for i in ids]
        except (TypeError, ValueError) as exc:
            raise TokenizerError(f"{self.source}: decode needs integer token ids: {exc}") from None
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise TokenizerError(f"{self.source}: token ids {bad[:5]} out of range [0, {n})")
        return self._tok.decode(ids, skip_special_tokens=False)

    def encode_with_offsets(self, text: str, add_special_tokens: bool = True) -> EncodingWithOffsets:
        if not isinstance(text, str):
            raise TokenizerError(f"{self.source}: encode needs a str, got {type(text).__name__}")
        enc = self._tok.encode(text, add_special_tokens=add_special_tokens)
        return EncodingWithOffsets(list(enc.ids), list(enc.tokens),
                                   [tuple(o) for o in enc.offsets])

    def to_str_tokens(self, text_or_ids: str | Sequence[int]) -> list[str]:
        ids = self.encode(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
        return [self.decode([i]) for i in ids]


def _token_str(tok: object, cfg: Path, key: str) -> str | None:
    """A special token's text from tokenizer_config.json (str, {"content": str} or null)."""
    if tok is None or isinstance(tok, str):
        return tok
    if isinstance(tok, dict) and isinstance(tok.get("content"), str):
        return tok["content"]
    raise TokenizerError(f"{cfg}: {key} must be a string or {{\"content\": string}}, got {tok!r:.60}")
