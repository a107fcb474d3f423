"""The 2025-26 families (OLMo-3, EXAONE-4, GLM-4, GLM-4.5, ERNIE-4.5 dense and MoE, Hunyuan
dense, Seed-OSS, Apertus) against transformers.

Reference: the tiny random checkpoints of tests/support/tiny_families_recent.py built and
loaded by transformers (eager attention, F32, unit-scale embeddings, MoE selection biases
randomised). Tolerance: max abs diff < 1e-4 on logits, the embedding, every layer's residual
stream and attention pattern; left-padded rows equal to each row alone (< 1e-4); greedy
generation with the KV cache token-for-token equal to transformers'.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.support.family_checks import assert_left_padding_rows_alone, assert_matches_transformers
from tests.support.tiny_families_recent import RECENT_FAMILIES

FAMILIES = list(RECENT_FAMILIES)


@pytest.mark.parametrize("name", FAMILIES)
def test_family_matches_transformers(tiny, make_ids, name):
    assert_matches_transformers(tiny(name), make_ids(2, 16, seed=41))


@pytest.mark.parametrize("name", FAMILIES)
def test_left_padding_rows_equal_running_alone(loaded, make_ids, name):
    assert_left_padding_rows_alone(loaded(name), [make_ids(1, 14, seed=5)[0],
                                                  make_ids(1, 8, seed=6)[0]])


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_generation_equals_transformers(tiny, loaded, make_ids, name):
    """8 prompt + 10 new tokens with the KV cache: past the window of 5 on sliding layers."""
    t, model = tiny(name), loaded(name)
    ids = make_ids(2, 8, seed=7)
    ours = model.generate(ids, max_new_tokens=10, stop_at_eos=False)
    with torch.no_grad():
        ref = copy.deepcopy(t.hf).generate(ids, attention_mask=torch.ones_like(ids),
                                           max_new_tokens=10, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.tokens, ref)
