"""Character <-> token positions, memory reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import mi_core as mi
from mi_core.serialize import from_json, to_json
from mi_core.util.memory import MemoryReport, MemorySnapshot
from mi_core.util.positions import PositionConversion, convert_positions, token_to_char_span


@pytest.fixture(scope="module")
def hf_tok():
    """A real `tokenizers` WordLevel tokenizer with whitespace pre-tokenisation (offsets real)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "The": 1, "capital": 2, "of": 3, "France": 4, "is": 5}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return mi.HFTokenizer(t)


def test_char_positions_map_to_their_tokens(hf_tok):
    text = "The capital of France is"
    r = convert_positions(hf_tok, text, [0, 4, 10, 11, 15, 22])
    assert [c.token_index for c in r] == [0, 1, 1, None, 3, 4]
    assert r[4].token == "France" and r[4].span == (15, 21)
    assert token_to_char_span(hf_tok, text, -1) == (22, 24)
    back = from_json(to_json(r[4]), PositionConversion)
    assert back == r[4]


def test_positions_count_special_tokens_like_to_tokens():
    from tests.support.fake_backend import fake_model

    m = fake_model()
    r = convert_positions(m, "abc", [0, 2])
    ids = m.to_tokens("abc")[0].tolist()
    assert [c.token_index for c in r] == [1, 3] and ids[3] == ord("c") + 1
    assert convert_positions(m, "abc", [0], add_special_tokens=False)[0].token_index == 0


def test_out_of_range_char_position(hf_tok):
    with pytest.raises(mi.TokenizerError, match="character position 99"):
        convert_positions(hf_tok, "The", [99])


def test_memory_report_sees_an_allocation():
    # In a fresh process: in a long-lived test worker the allocator may reuse pages that
    # earlier tests freed, and a new allocation would then not raise RSS.
    code = (
        "import torch\n"
        "from mi_core.util.memory import MemoryReport\n"
        "with MemoryReport.measure('alloc') as rep:\n"
        "    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched\n"
        "    big += 1\n"
        "print(rep.rss_delta_bytes, rep.after.rss_bytes)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    delta, after = map(int, out.stdout.split())
    assert after > 0 and delta > 32 * 2**20
    with MemoryReport.measure("alloc") as rep:
        pass
    assert rep.after is not None and "alloc: RSS" in rep.summary()
    snap = MemorySnapshot.now()
    assert snap.peak_rss_bytes >= snap.rss_bytes > 0
    assert from_json(to_json(rep), MemoryReport) == rep
