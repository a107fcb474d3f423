"""Padded batches, KV-cached greedy generation (vs transformers' generate), and the
recurrent `layer_schedule` / `between_layers` options."""

from __future__ import annotations

import copy

import pytest
import torch

import mi_core as mi

TOL = 1e-4


def _pad(rows: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), n), dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(n - len(r), n) if side == "left" else slice(0, len(r))
        ids[i, sl], mask[i, sl] = r, 1
    return ids, mask


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
def test_padded_batch_rows_equal_running_each_alone(tiny, make_ids, name, side):
    model = tiny(name).load()
    rows = [make_ids(1, 14, seed=5)[0], make_ids(1, 8, seed=6)[0]]
    ids, mask = _pad(rows, side)
    pts = ["blocks.2.hook_resid_post", "blocks.1.attn.hook_pattern", "blocks.0.attn.hook_rot_k"]
    batch = model.forward(ids, mi.HookSpec().capture_all(pts), attention_mask=mask)
    for i, r in enumerate(rows):
        alone = model.forward(r[None], mi.HookSpec().capture_all(pts))
        real = mask[i].bool()
        assert (batch.output[i, real] - alone.output[0]).abs().max().item() < TOL
        for p in pts[0::2]:
            assert (batch[p][i, real] - alone[p][0]).abs().max().item() < TOL, p
        pat = batch[pts[1]][i][:, real][:, :, real]  # real queries x real keys
        assert (pat - alone[pts[1]][0]).abs().max().item() < TOL


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "qwen2_tied", "phi3",
                                  "llama_dynamic_rope", "gemma3_text", "starcoder2"])
def test_greedy_generation_equals_transformers(tiny, make_ids, name):
    """Prompt 8 + 10 new tokens: past the sliding window (5) of Mistral / Gemma 2."""
    t = tiny(name)
    model = t.load()
    ids = make_ids(2, 8, seed=7)
    # llama_dynamic_rope's context is 12: it runs past it on purpose (the NTK base grows)
    ours = model.generate(ids, max_new_tokens=10, stop_at_eos=False, allow_beyond_context=True)
    hf = copy.deepcopy(t.hf)  # dynamic RoPE keeps state in the HF module; keep the shared one clean
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.tokens, ref)


def test_greedy_generation_with_left_padding_equals_transformers(tiny, make_ids):
    t = tiny("mistral")
    model = t.load()
    ids, mask = _pad([make_ids(1, 9, seed=8)[0], make_ids(1, 6, seed=9)[0]], "left")
    ours = model.generate(ids, max_new_tokens=8, attention_mask=mask, stop_at_eos=False)
    with torch.no_grad():
        ref = t.hf.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.tokens, ref)


def test_cached_step_logits_equal_a_full_recompute(tiny, make_ids):
    model = tiny("gemma3_text").load()
    ids = make_ids(2, 12, seed=10)
    be = model.backend
    past = be.new_past(2)
    model.forward(ids[:, :9], past=past)
    step = model.forward(ids[:, 9:], past=past).output
    full = model.forward(ids).output[:, 9:]
    assert (step - full).abs().max().item() < TOL


def test_hooks_apply_at_every_generation_step(llama_model, make_ids):
    ids = make_ids(1, 6, seed=11)
    calls: list[int] = []
    direction = torch.randn(llama_model.hidden_size, generator=torch.Generator().manual_seed(0))

    def steer(t: torch.Tensor, hook: mi.HookPoint) -> torch.Tensor:
        calls.append(t.shape[1])
        return t + 3.0 * direction

    spec = mi.HookSpec().intervene("blocks.1.hook_resid_post", steer)
    res = llama_model.generate(ids, max_new_tokens=5, hooks=spec, stop_at_eos=False)
    assert calls == [6, 1, 1, 1, 1]  # prefill, then one call per new token (the last is not run)
    # the same steering without a cache, recomputing the whole prefix each step
    seq = ids
    for _ in range(5):
        logits = llama_model.forward(seq, spec).output[:, -1]
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(res.tokens, seq)
    plain = llama_model.generate(ids, max_new_tokens=5, stop_at_eos=False)
    assert not torch.equal(plain.tokens, res.tokens)  # the steering did something


def test_layer_schedule_default_equals_no_schedule(llama_model, make_ids):
    ids = make_ids(2, 8)
    a = llama_model.forward(ids).output
    b = llama_model.forward(ids, layer_schedule=[0, 1, 2]).output
    assert torch.equal(a, b)


def test_repeated_layer_applies_the_same_block_to_the_new_residual(llama_model, make_ids):
    ids = make_ids(1, 8)
    seen: list[tuple[int, int, torch.Tensor]] = []

    def record(step: int, layer: int, resid: torch.Tensor) -> torch.Tensor:
        seen.append((step, layer, resid.clone()))
        return resid

    spec = mi.HookSpec().capture("blocks.1.hook_resid_post")
    cache = llama_model.forward(ids, spec, layer_schedule=[0, 1, 1, 2], between_layers=record)
    assert [(s, l) for s, l, _ in seen] == [(0, 0), (1, 1), (2, 1), (3, 2)]
    assert torch.equal(cache["blocks.1.hook_resid_post"], seen[2][2])  # the last firing is kept
    # layer 1 applied alone to the step-1 residual gives the step-2 residual
    again: list[torch.Tensor] = []
    llama_model.forward(ids, mi.HookSpec().intervene("hook_embed", mi.Replace(seen[1][2])),
                        layer_schedule=[1], between_layers=lambda s, l, r: again.append(r) or r)
    assert (again[0] - seen[2][2]).abs().max().item() < 1e-5


def test_between_layers_output_replaces_the_residual(llama_model, make_ids):
    ids = make_ids(2, 8)
    out = llama_model.forward(ids, between_layers=lambda s, l, r: torch.zeros_like(r)).output
    want = llama_model.backend.project_to_vocab(torch.zeros(llama_model.hidden_size))
    assert (out - want).abs().max().item() < 1e-5


def test_kv_cache_with_a_repeated_layer_schedule_matches_full_recompute(llama_model, make_ids):
    ids = make_ids(2, 10, seed=12)
    sched = [0, 1, 2, 1, 2]
    be = llama_model.backend
    past = be.new_past(2)
    llama_model.forward(ids[:, :7], past=past, layer_schedule=sched)
    step = llama_model.forward(ids[:, 7:], past=past, layer_schedule=sched).output
    full = llama_model.forward(ids, layer_schedule=sched).output[:, 7:]
    assert (step - full).abs().max().item() < TOL
    with pytest.raises(mi.MIError, match="layer_schedule"):
        llama_model.forward(ids[:, :1], past=past, layer_schedule=[0, 1, 2])


def test_right_padded_cached_decoding_past_the_window_equals_each_row_alone(tiny, make_ids):
    """Tokens appended after a row's right pads: the sliding window (5) counts real tokens, so
    each row decodes as it would alone. (MIModel.generate reads the last slot's logits, so it
    is meant for left padding; this drives the cache directly.)"""
    model = tiny("mistral").load()
    rows = [make_ids(1, 9, seed=13)[0], make_ids(1, 4, seed=14)[0]]
    ids, mask = _pad(rows, "right")
    past = model.backend.new_past(2)
    logits = model.forward(ids, attention_mask=mask, past=past).output
    nxt = logits[torch.arange(2), mask.sum(1) - 1].argmax(-1)
    got = [nxt]
    for _ in range(7):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        nxt = model.forward(nxt[:, None], attention_mask=mask, past=past).output[:, -1].argmax(-1)
        got.append(nxt)
    batch_new = torch.stack(got, dim=1)
    for i, r in enumerate(rows):
        alone = model.generate(r[None], max_new_tokens=8, stop_at_eos=False)
        assert torch.equal(batch_new[i], alone.new_tokens[0])
