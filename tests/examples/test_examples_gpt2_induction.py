"""examples/induction_heads_gpt2.py: a GPT-2 checkpoint written in GPT-2's own layout, loaded
through the GPT-2 path, with a hand-built induction circuit the detector must find."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import mi_core as mi

EXAMPLE = Path(__file__).parents[2] / "examples" / "induction_heads_gpt2.py"


def _example():
    spec = importlib.util.spec_from_file_location("example_induction_heads_gpt2", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_detector_finds_the_planted_induction_and_previous_token_heads(tmp_path):
    r = _example().main(str(tmp_path / "gpt2"))
    assert r["top"][0][:2] == (1, 0) and r["top"][0][2] > 0.8  # measured 0.97
    assert r["previous"][0][:2] == (0, 0) and r["previous"][0][2] > 0.8  # measured 1.00
    assert r["loss_second"] < r["loss_first"] - 3  # measured 7.3 vs 0.9 nats/token


def test_the_written_checkpoint_is_gpt2_as_transformers_reads_it(tmp_path):
    """Independent reference: transformers' GPT2LMHeadModel on the same files."""
    from transformers import GPT2LMHeadModel

    path = _example().write_gpt2_checkpoint(tmp_path / "gpt2")
    ref = GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager").eval()
    ids = torch.randint(0, 128, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(ids).logits
    got = mi.MIModel.from_pretrained(path).forward(ids).output
    assert (got - want).abs().max().item() < 1e-4
