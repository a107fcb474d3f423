"""Character position <-> token index conversion via the tokenizer's offsets."""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from mi_core.plugin import TokenizerError


@attrs.define
class PositionConversion:
    """Character `char_pos` of the text falls in token `token_index` (None: in no token,
    e.g. a space merged away); `token` is that token's string, `span` its [start, end)."""

    char_pos: int
    token_index: int | None
    token: str | None = None
    span: tuple[int, int] | None = None


def convert_positions(tokenizer: Any, text: str, char_positions: Sequence[int],
                      add_special_tokens: bool = True) -> list[PositionConversion]:
    """Map character positions of `text` to token indices (indices count special tokens
    when `add_special_tokens`, matching ``model.to_tokens``). `tokenizer`: an MITokenizer or
    an MIModel. TokenizerError for a position outside the text."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    enc = tok.encode_with_offsets(text, add_special_tokens=add_special_tokens)
    out = []
    for c in char_positions:
        c = int(c)
        if not 0 <= c < len(text):
            raise TokenizerError(f"character position {c} out of range for a text of "
                                 f"{len(text)} characters")
        hit = None
        for i, (s, e) in enumerate(enc.offsets):
            if s <= c < e:
                hit = i
                break
        out.append(PositionConversion(c, hit, enc.tokens[hit] if hit is not None else None,
                                      tuple(enc.offsets[hit]) if hit is not None else None))
    return out


def token_to_char_span(tokenizer: Any, text: str, token_index: int,
                       add_special_tokens: bool = True) -> tuple[int, int]:
    """The [start, end) character span of token `token_index` (negative: from the end)."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    enc = tok.encode_with_offsets(text, add_special_tokens=add_special_tokens)
    n = len(enc.ids)
    i = token_index + n if token_index < 0 else token_index
    if not 0 <= i < n:
        raise TokenizerError(f"token index {token_index} out of range for {n} tokens")
    s, e = enc.offsets[i]
    return int(s), int(e)
