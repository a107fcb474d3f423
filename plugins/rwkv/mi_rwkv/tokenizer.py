"""The RWKV World tokenizer: greedy longest-match over a byte trie.

Vocabulary file format (``rwkv_vocab_v20230424.txt``): one token a line,
``<id> <python str or bytes literal> <byte length>``. Literals are parsed with
``ast.literal_eval`` (no code is executed). Id 0 is end-of-text and has no bytes.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Sequence

from mi_core.plugin import EncodingWithOffsets, TokenizerError

VOCAB_FILE = "rwkv_vocab_v20230424.txt"
_END = -1  # key of a trie node's token id


def _literal(text: str) -> str | bytes:
    """A Python str / bytes literal; plain quoted text without escapes skips the parser."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" and "\\" not in text \
            and text[0] not in text[1:-1]:
        return text[1:-1]
    return ast.literal_eval(text)


class WorldTokenizer:
    """MITokenizer over the RWKV World vocabulary. ``encode`` is byte-level and lossless."""

    def __init__(self, tokens: dict[int, bytes], source: str = "<memory>") -> None:
        self.source = source
        self._id2bytes = dict(tokens)
        self._root: dict[int, dict] = {}
        for i, tok in tokens.items():
            if not tok:
                raise TokenizerError(f"{source}: token {i} is empty")
            node = self._root
            for byte in tok:
                node = node.setdefault(byte, {})
            node[_END] = i  # type: ignore[assignment]
        missing = [b for b in range(256) if b not in self._root or _END not in self._root[b]]
        if missing:
            raise TokenizerError(f"{source}: single-byte tokens missing for bytes {missing[:8]}; "
                                 "some inputs could not be encoded")
        self._size = max(tokens) + 1 if tokens else 1

    @classmethod
    def from_file(cls, path: str | Path) -> "WorldTokenizer":
        path = Path(path)
        tokens: dict[int, bytes] = {}
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{path}: cannot read vocabulary: {exc}") from exc
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                idx = int(line[:line.index(" ")])
                lit = _literal(line[line.index(" "):line.rindex(" ")].strip())
                length = int(line[line.rindex(" "):])
            except (ValueError, SyntaxError) as exc:
                raise TokenizerError(f"{path}:{n}: malformed vocabulary line: {exc}") from exc
            tok = lit.encode("utf-8") if isinstance(lit, str) else lit
            if not isinstance(tok, bytes) or len(tok) != length:
                raise TokenizerError(f"{path}:{n}: token {idx} literal does not have the declared "
                                     f"byte length {length}")
            if idx in tokens:
                raise TokenizerError(f"{path}:{n}: duplicate token id {idx}")
            tokens[idx] = tok
        return cls(tokens, source=str(path))

    # -- protocol -----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def bos_token_id(self) -> int | None:
        return None

    @property
    def eos_token_id(self) -> int | None:
        return 0

    def encode_bytes(self, data: bytes) -> list[int]:
        """Greedy longest match: at each position take the longest vocabulary token."""
        out: list[int] = []
        root, i, n = self._root, 0, len(data)
        while i < n:
            node, j, best, best_end = root, i, -1, i
            while j < n:
                nxt = node.get(data[j])
                if nxt is None:
                    break
                node, j = nxt, j + 1
                tid = node.get(_END)
                if tid is not None:
                    best, best_end = tid, j  # type: ignore[assignment]
            out.append(best)
            i = best_end
        return out

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.encode_bytes(text.encode("utf-8"))

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        parts = []
        for i in ids:
            i = int(i)
            if i == 0:
                continue  # end-of-text has no bytes
            tok = self._id2bytes.get(i)
            if tok is None:
                raise TokenizerError(f"{self.source}: token id {i} is not in the vocabulary")
            parts.append(tok)
        return b"".join(parts)

    def decode(self, ids: Sequence[int]) -> str:
        """UTF-8 text; a sequence that ends inside a character shows U+FFFD for it."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def encode_with_offsets(self, text: str, add_special_tokens: bool = True) -> EncodingWithOffsets:
        """Character offsets; a token that splits a character spans that whole character."""
        data = text.encode("utf-8")
        char_of = [0] * (len(data) + 1)   # byte index -> index of the char containing it
        pos = 0
        for ci, ch in enumerate(text):
            for _ in range(len(ch.encode("utf-8"))):
                char_of[pos] = ci
                pos += 1
        char_of[len(data)] = len(text)
        ids = self.encode_bytes(data)
        offsets, tokens, b = [], [], 0
        for i in ids:
            e = b + len(self._id2bytes[i])
            start = char_of[b]
            end = char_of[e] if e == len(data) or char_of[e - 1] != char_of[e] else char_of[e] + 1
            offsets.append((start, end))
            tokens.append(self._id2bytes[i].decode("utf-8", errors="replace"))
            b = e
        return EncodingWithOffsets(ids, tokens, offsets)

    def to_str_tokens(self, text_or_ids: str | Sequence[int]) -> list[str]:
        ids = self.encode(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
        return [self.decode([i]) for i in ids]


def detect_world_vocab(directory: Path) -> bool:
    return (Path(directory) / VOCAB_FILE).is_file()


def load_world_vocab(directory: Path) -> WorldTokenizer:
    return WorldTokenizer.from_file(Path(directory) / VOCAB_FILE)
