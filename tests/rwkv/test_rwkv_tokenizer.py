"""The World tokenizer against the `rwkv` package's TRIE_TOKENIZER on the real vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest

from mi_core.errors import TokenizerError
from mi_core.tokenizer import MITokenizer
from mi_rwkv import WorldTokenizer

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "    def forward(self, x):\n\t\treturn x ** 2  # squared\n\n",
    "Ünïcödé façade naïve résumé – em—dash … “quotes” ‘single’",
    "日本語のテキストと中文混合，还有한국어 문장。",
    "Emoji 🦆🪿🚀 and flags 🇫🇷🇯🇵, ZWJ 👩‍💻, combining é.",
    "Русский текст, ελληνικά, עברית, العربية, हिन्दी.",
    "Numbers 1234567890 3.14159e-10 0xDEADBEEF, URLs https://example.com/a?b=c&d=e",
    "\x00\x01\x7f control chars \r\n and spaces" + " " * 130 + "end",
    "################################################################################ rule",
    "",
]


@pytest.fixture(scope="module")
def tokenizers(world_vocab: Path) -> tuple[WorldTokenizer, object]:
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

    return WorldTokenizer.from_file(world_vocab), TRIE_TOKENIZER(str(world_vocab))


def test_ids_equal_trie_tokenizer_on_a_varied_corpus(tokenizers: tuple) -> None:
    ours, ref = tokenizers
    for text in CORPUS:
        assert ours.encode(text) == ref.encode(text), text


def test_round_trip_is_exact_on_mixed_scripts_and_raw_bytes(tokenizers: tuple) -> None:
    ours, _ = tokenizers
    for text in CORPUS:
        assert ours.decode(ours.encode(text)) == text
    raw = bytes(range(256)) + b"\xff\xfe\xc3" + "é".encode() + b"\x80"
    assert ours.decode_bytes(ours.encode_bytes(raw)) == raw


def test_implements_the_core_protocol_with_eos_zero(tokenizers: tuple) -> None:
    ours, _ = tokenizers
    assert isinstance(ours, MITokenizer)
    assert ours.eos_token_id == 0 and ours.bos_token_id is None
    assert ours.vocab_size == 65530  # ids 0..65529 in rwkv_vocab_v20230424.txt
    assert ours.decode([0]) == ""
    with pytest.raises(TokenizerError, match="70000"):
        ours.decode([70000])


def test_offsets_cover_the_text_and_to_str_tokens_decode_each(tokenizers: tuple) -> None:
    ours, _ = tokenizers
    text = "naïve 日本 ok"
    enc = ours.encode_with_offsets(text)
    assert enc.ids == ours.encode(text)
    assert enc.offsets[0][0] == 0 and enc.offsets[-1][1] == len(text)
    assert all(a <= b for a, b in enc.offsets)
    for tok, (a, b) in zip(enc.tokens, enc.offsets):
        if "\ufffd" not in tok:  # tokens that hold whole characters map back exactly
            assert text[a:b] == tok
    assert ours.to_str_tokens("Hello world") == ["Hello", " world"]


def test_malformed_vocabulary_line_is_a_tokenizer_error(tmp_path: Path) -> None:
    p = tmp_path / "rwkv_vocab_v20230424.txt"
    p.write_text("1 'a' 2\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match="byte length"):
        WorldTokenizer.from_file(p)
