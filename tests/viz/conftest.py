"""Fixtures of the view tests: one headless Chromium per module, the tiny LLaMA checkpoint
(word-level tokenizer, 3 layers) that the CLT tests use."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.browser import Browser, browser_or_fail

CLT_FIX = Path(__file__).parents[1] / "clt" / "fixtures"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium with a 1400 x 900 viewport (the size the screenshots are taken at)."""
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
    """What the pages display for a token: Python's repr, as the terminal prints it
    (common.js MI.tok implements it; tests/viz/test_viz_glance.py checks the two agree)."""
    return repr(token)
