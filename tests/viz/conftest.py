"""Fixtures of the view tests: one headless Chromium per module, the tiny LLaMA checkpoint
(word-level tokenizer, 3 layers) that the CLT tests use."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.browser import Browser, browser_or_fail

CLT_FIX = Path(__file__).parents[1] / "clt" / "fixtures"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = browser_or_fail()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="session")
def tiny() -> Any:
    import mi_core as mi

    return mi.MIModel.from_pretrained(CLT_FIX / "tiny_llama")


def shown(token: str) -> str:
    """What the pages display for a token (common.js MI.tok, re-implemented here)."""
    if token and set(token) == {" "}:
        return "␣" * len(token)
    names = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return re.sub("[\x00-\x1f\x7f\xa0]", lambda m: names.get(m.group(), f"\\x{ord(m.group()):02x}"),
                  token)
