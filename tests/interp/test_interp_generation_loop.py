"""One generation loop: generate_recurrent is MIModel.generate with per-step forward options,
on the KV cache. References: transformers' greedy generate (plain schedule) and the
uncached loop that recomputes the whole sequence with the recurrent schedule every step."""

from __future__ import annotations

from typing import Any, Sequence

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    RecurrentFeedbackEntry, RecurrentPassSpec, forward_recurrent, generate_recurrent,
)
from mi_core.interp.recurrent import _options

PROMPT, NEW = 6, 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(MIModel over a tiny random LLaMA-layout checkpoint, the transformers model)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mi_core.registry import ModelSource
    from mi_transformer.loader import load_backend

    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                      max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.3 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("tiny_llama")
    hf.save_pretrained(path)
    be = load_backend(ModelSource(path=path), torch.device("cpu"), torch.float32)
    return mi.MIModel(be, source=str(path)), hf


class _Tok:
    """Just what generation reads of a tokenizer: the EOS id and decode."""

    bos_token_id = None

    def __init__(self, eos: int | None) -> None:
        self.eos_token_id = eos

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(map(str, ids))


@pytest.fixture()
def model(tiny):
    m, _ = tiny
    m.backend.tokenizer = _Tok(None)
    yield m
    m.backend.tokenizer = None


def _prompt(batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 64, (batch, PROMPT), generator=torch.Generator().manual_seed(seed))


class _Counter:
    """Wraps backend.forward: records the number of positions of every call."""

    def __init__(self, model: mi.MIModel) -> None:
        self.model, self.seqs = model, []
        self.inner = model.backend.forward

    def __enter__(self) -> "_Counter":
        def counting(ids: torch.Tensor, *a: Any, **k: Any):
            self.seqs.append(int(ids.shape[1]))
            return self.inner(ids, *a, **k)
        self.model.backend.forward = counting
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.model.backend.forward  # back to the class method


def _recompute(model: mi.MIModel, ids: torch.Tensor, spec: RecurrentPassSpec, n: int
               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Reference: the uncached loop, the whole sequence through the recurrent schedule each step."""
    cur, logits = ids, []
    for _ in range(n):
        lg = forward_recurrent(model, cur, spec).output[:, -1].float()
        logits.append(lg)
        cur = torch.cat([cur, lg.argmax(-1, keepdim=True)], 1)
    return cur, logits


def test_plain_schedule_equals_generate_and_transformers(model, tiny) -> None:
    ids = _prompt()
    rec = generate_recurrent(model, ids, RecurrentPassSpec(0, 2, extra_passes=0), NEW,
                             stop_at_eos=False)
    plain = model.generate(ids, NEW, stop_at_eos=False)
    ref = tiny[1].generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    assert rec.tokens.tolist() == plain.tokens.tolist() == ref.tolist()


@pytest.mark.parametrize("feedback", [[], [RecurrentFeedbackEntry(torch.ones(32), 0.5, 0)]],
                         ids=["no_feedback", "feedback_in_the_prompt"])
def test_cached_recurrent_generation_equals_recomputing_the_whole_sequence(model, feedback) -> None:
    spec = RecurrentPassSpec(1, 2, extra_passes=1, feedback=feedback)
    ids = _prompt(seed=1)
    ref_tokens, ref_logits = _recompute(model, ids, spec, NEW)
    got = model.generate(ids, NEW, stop_at_eos=False, return_logits=True,
                         forward_options=lambda offset: _options(model, spec, offset))
    assert got.tokens.tolist() == ref_tokens.tolist()
    assert generate_recurrent(model, ids, spec, NEW).tokens.tolist() == ref_tokens.tolist()
    diff = max(float((a - b).abs().max()) for a, b in zip(got.step_logits, ref_logits))
    assert diff < 1e-4  # F32, same math in a different order (cache vs recompute)


@pytest.mark.parametrize("spec", [None, RecurrentPassSpec(0, 1, extra_passes=2)],
                         ids=["generate", "generate_recurrent"])
def test_the_prefix_is_computed_once(model, spec) -> None:
    ids = _prompt()
    with _Counter(model) as c:
        if spec is None:
            model.generate(ids, NEW, stop_at_eos=False)
        else:
            generate_recurrent(model, ids, spec, NEW, stop_at_eos=False)
    assert c.seqs == [PROMPT] + [1] * (NEW - 1)


def test_eos_is_handled_the_same_by_both_loops(model) -> None:
    ids = _prompt(batch=2, seed=3)
    free = model.generate(ids, NEW, stop_at_eos=False).new_tokens
    eos = int(free[0, 1])  # row 0 stops at its second token; row 1 goes on (unless it too)
    model.backend.tokenizer = _Tok(eos)
    plain = model.generate(ids, NEW)
    rec = generate_recurrent(model, ids, RecurrentPassSpec(0, 2, extra_passes=0), NEW)
    assert rec.tokens.tolist() == plain.tokens.tolist()
    assert plain.new_tokens[0, 1:].tolist() == [eos] * (plain.new_tokens.shape[1] - 1)
    assert plain.new_tokens[1, 0].item() == free[1, 0].item()


def test_an_unsustained_schedule_applies_to_the_first_token_only(model) -> None:
    spec = RecurrentPassSpec(0, 1, extra_passes=2, sustained=False)
    ids = _prompt(seed=2)
    got = generate_recurrent(model, ids, spec, NEW, stop_at_eos=False)
    first = forward_recurrent(model, ids, spec).output[:, -1].argmax(-1, keepdim=True)
    rest = model.generate(torch.cat([ids, first], 1), NEW - 1, stop_at_eos=False)
    assert got.tokens.tolist() == rest.tokens.tolist()
    with _Counter(model) as c:
        generate_recurrent(model, ids, spec, NEW, stop_at_eos=False)
    assert c.seqs == [PROMPT, PROMPT + 1] + [1] * (NEW - 2)
