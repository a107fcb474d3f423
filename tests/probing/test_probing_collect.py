"""Activation collection: batching with padding, positions, streaming to disk, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_probing import ActivationSet, Position, ProbingError, collect_activations

TEXTS = ["the film was good", "a movie", "the plot was really very bad", "one two three",
         "the acting was fine", "cat", "red dog house tree blue"]
HOOKS = ["hook_embed", "blocks.1.hook_resid_post", "blocks.2.hook_resid_post"]


def _unbatched(model: mi.MIModel, text: str, hook: str) -> torch.Tensor:
    """Reference: one prompt alone (no padding), full [seq, d] activation at `hook`."""
    cache = model.forward(model.to_tokens(text), mi.HookSpec().capture(hook))
    return cache[hook][0]


@pytest.mark.parametrize("position", ["last", "mean", 0, 2, -2])
def test_batched_right_padded_features_equal_one_prompt_at_a_time(toy_model, position):
    # Batches of 3 mix lengths 1..7, so most rows are padded; the reference runs each
    # prompt alone. float32 matmuls of different batch shapes: 1e-5 absolute.
    short_ok = [t for t in TEXTS if len(t.split()) >= 3] if position in (2, -2) else TEXTS
    acts = collect_activations(toy_model, short_ok, HOOKS, position=position, batch_size=3,
                               progress=False)
    for hook in HOOKS:
        got = acts[hook]
        assert got.shape == (len(short_ok), 16) and got.dtype == torch.float32
        for i, text in enumerate(short_ok):
            full = _unbatched(toy_model, text, hook)
            want = full.mean(dim=0) if position == "mean" else \
                full[-1] if position == "last" else full[position]
            torch.testing.assert_close(got[i], want, atol=1e-5, rtol=0)


def test_streaming_to_disk_gives_the_same_rows_and_reloads(toy_model, tmp_path: Path):
    mem = collect_activations(toy_model, TEXTS, HOOKS, batch_size=2, progress=False)
    # shard_bytes=1: every batch becomes its own shard, so concatenation order is exercised
    disk = collect_activations(toy_model, TEXTS, HOOKS, batch_size=2, out_dir=tmp_path / "a",
                               shard_bytes=1, progress=False)
    assert disk.on_disk and not mem.on_disk
    assert len(list((tmp_path / "a").glob("shard_*.safetensors"))) == 4  # ceil(7 / 2)
    again = ActivationSet.load(tmp_path / "a")
    for hook in HOOKS:
        assert torch.equal(disk[hook], mem[hook])
        assert torch.equal(again[hook], mem[hook])
    assert again.feature_shapes == mem.feature_shapes and str(again.position) == "last"


def test_exceeding_the_memory_bound_moves_features_to_a_temporary_directory(toy_model):
    mem = collect_activations(toy_model, TEXTS, HOOKS, batch_size=2, progress=False)
    # 2 prompts x 3 hooks x 16 floats = 384 bytes per batch: a 500-byte bound spills after 2
    spilled = collect_activations(toy_model, TEXTS, HOOKS, batch_size=2, max_memory_bytes=500,
                                  progress=False)
    assert spilled.on_disk and spilled.directory is not None
    for hook in HOOKS:
        assert torch.equal(spilled[hook], mem[hook])


def test_save_then_load_round_trips_in_memory_features(toy_model, tmp_path: Path):
    mem = collect_activations(toy_model, TEXTS, HOOKS, position="mean", progress=False)
    loaded = ActivationSet.load(mem.save(tmp_path / "saved"))
    assert str(loaded.position) == "mean"
    for hook in HOOKS:
        assert torch.equal(loaded[hook], mem[hook])


def test_unknown_hook_point_is_a_hook_error_before_any_forward(toy_model):
    with pytest.raises(mi.HookError, match="blocks.7.hook_resid_post.*out of range"):
        collect_activations(toy_model, TEXTS, ["blocks.7.hook_resid_post"], progress=False)
    with pytest.raises(mi.HookError, match="blocks.0.mlp.hook_post"):
        collect_activations(toy_model, TEXTS, ["blocks.0.mlp.hook_post"], progress=False)
    assert toy_model.backend.forward_calls == 0


def test_token_index_beyond_a_prompt_names_the_prompt(toy_model):
    with pytest.raises(ProbingError, match="position 3 is outside prompt 1, which has 2 tokens"):
        collect_activations(toy_model, TEXTS, HOOKS, position=3, progress=False)


def test_point_without_a_per_token_layout_is_rejected(toy_model):
    with pytest.raises(ProbingError, match=r"blocks.0.attn.hook_pattern.*not \[batch"):
        collect_activations(toy_model, TEXTS, ["blocks.0.attn.hook_pattern"], progress=False)


def test_uncollected_hook_lookup_and_bad_position_are_typed_errors(toy_model, tmp_path: Path):
    acts = collect_activations(toy_model, TEXTS[:2], ["hook_embed"], progress=False)
    with pytest.raises(mi.HookError, match="blocks.0.hook_resid_post.*was not collected"):
        acts.get("blocks.0.hook_resid_post")
    with pytest.raises(ProbingError, match="position must be"):
        Position.parse("first")
    with pytest.raises(ProbingError, match="not found"):
        ActivationSet.load(tmp_path)
