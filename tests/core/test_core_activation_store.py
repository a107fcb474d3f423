"""mi.cache_activations / mi.ActivationStore: stored values equal a direct capture of the same
hooks with the same batching (exact, torch.equal), shards are standard safetensors
(safetensors.torch.load_file reads them), resumable shard by shard, bounded-shuffle reading."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import mi_core as mi
from mi_core.scale import activations as act_mod
from mi_core.scale import shards as shards_mod
from tests.support.fake_backend import fake_model
from tests.support.ray_cluster import ray_cluster  # noqa: F401 - fixture
from tests.support.toy_checkpoint import write_toy_checkpoint

HOOKS = ["blocks.0.hook_resid_post", "blocks.2.mlp.hook_post", "blocks.1.attn.hook_pattern"]
CTX, BS = 8, 3


@pytest.fixture(scope="module")
def model() -> mi.MIModel:
    return fake_model(seed=0)


@pytest.fixture(scope="module")
def rows() -> torch.Tensor:
    return torch.randint(1, 250, (11, CTX), generator=torch.Generator().manual_seed(0))


def direct(model: mi.MIModel, rows: torch.Tensor, hook: str) -> torch.Tensor:
    """The reference: a plain forward per batch of BS rows, flattened to one row per token
    (per query token for attention patterns)."""
    out = []
    for a in range(0, rows.shape[0], BS):
        t = model.forward(rows[a:a + BS], mi.HookSpec().capture(hook))[hook]
        if hook.endswith("hook_pattern"):
            t = t.transpose(1, 2)
        out.append(t.reshape(-1, *t.shape[2:]))
    return torch.cat(out)


def all_of(store: mi.ActivationStore, hook: str) -> torch.Tensor:
    return torch.cat(list(store.batches(hook, batch_size=1000)))


def test_stored_values_equal_a_direct_capture(model, rows, tmp_path):
    # batches never span shards: with 2-row shards and batch_size 2 the batching differs from
    # the reference's, and batched matmuls may differ in the last bits (values ~10: 1e-4)
    store = mi.cache_activations(model, rows, HOOKS, tmp_path / "a", context_len=CTX,
                                 batch_size=2, tokens_per_shard=2 * CTX)
    assert store.complete and store.tokens == 11 * CTX and len(store.shards) == 6
    ref_store = mi.cache_activations(model, rows, HOOKS, tmp_path / "b", context_len=CTX,
                                     batch_size=BS, tokens_per_shard=3 * CTX)
    for h in HOOKS:
        assert torch.equal(all_of(ref_store, h), direct(model, rows, h))
        assert torch.allclose(all_of(store, h), direct(model, rows, h), atol=1e-4, rtol=0)
    assert store.hooks["blocks.1.attn.hook_pattern"]["shape"] == [model.num_heads, CTX]
    assert torch.equal(ref_store.tokens_of(), rows.reshape(-1).to(torch.int32))


def test_shards_are_standard_safetensors(model, rows, tmp_path):
    store = mi.cache_activations(model, rows, HOOKS, tmp_path / "a", context_len=CTX,
                                 batch_size=BS, tokens_per_shard=3 * CTX)
    for i, path in enumerate(store.shards):
        ref = load_file(str(path))
        mine = store.shard_tensors(i)
        assert set(ref) == set(HOOKS) | {"tokens"}
        assert all(torch.equal(ref[k], mine[k]) for k in ref)
    # the disk use announced up front is what the shards hold (headers aside)
    data = sum(sum(t.numel() * t.element_size() for t in load_file(str(p)).values())
               for p in store.shards)
    assert store.report.planned_bytes == data


def test_texts_are_packed_into_rows_of_context_len(model, tmp_path, capsys):
    texts = ["hello world", "a second text", "x" * 30]
    store = mi.cache_activations(model, texts, HOOKS[:1], tmp_path / "a", context_len=CTX,
                                 batch_size=BS)
    stream = [i for t in texts for i in model.tokenizer.encode(t)]  # BOS per text
    n = len(stream) // CTX
    assert store.tokens == n * CTX and store.manifest["tokens_dropped"] == len(stream) - n * CTX
    assert store.tokens_of().tolist() == stream[: n * CTX]
    expect = direct(model, torch.tensor(stream[: n * CTX]).reshape(n, CTX), HOOKS[0])
    assert torch.equal(all_of(store, HOOKS[0]), expect)
    assert "GiB in 1 shards" in capsys.readouterr().err  # disk use reported up front


def test_resume_recomputes_only_missing_shards(model, rows, tmp_path, monkeypatch):
    out = tmp_path / "a"
    store = mi.cache_activations(model, rows, HOOKS, out, context_len=CTX, batch_size=BS,
                                 tokens_per_shard=3 * CTX)
    before = {p.name: p.read_bytes() for p in store.shards}
    store.shards[1].unlink()
    (out / "shard-00003.safetensors.tmp").write_bytes(b"torn")  # a killed writer's leftover
    calls = []
    real = act_mod._capture_task
    monkeypatch.setattr(act_mod, "_capture_task", lambda m, p: calls.append(p[2].shape[0]) or real(m, p))
    again = mi.cache_activations(model, rows, HOOKS, out, context_len=CTX, batch_size=BS,
                                 tokens_per_shard=3 * CTX)
    assert calls == [3] and again.report.shards_done_before == 3
    assert {p.name: p.read_bytes() for p in again.shards} == before
    assert not list(out.glob("*.tmp"))


def test_full_disk_keeps_finished_shards_and_leaves_no_partial_file(model, rows, tmp_path,
                                                                    monkeypatch):
    out = tmp_path / "a"
    real = shards_mod.ShardFile.write
    n = {"calls": 0}

    def failing(self, *a):
        n["calls"] += 1
        if self.path.name == "shard-00002.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a)

    monkeypatch.setattr(shards_mod.ShardFile, "write", failing)
    with pytest.raises(mi.StoreError, match="the disk is full"):
        mi.cache_activations(model, rows, HOOKS, out, context_len=CTX, batch_size=BS,
                             tokens_per_shard=3 * CTX)
    monkeypatch.setattr(shards_mod.ShardFile, "write", real)
    assert sorted(p.name for p in out.iterdir() if "shard" in p.name) == [
        "shard-00000.safetensors", "shard-00001.safetensors"]
    with pytest.raises(mi.StoreError, match="incomplete"):
        next(mi.ActivationStore(out).batches(HOOKS[0]))
    store = mi.cache_activations(model, rows, HOOKS, out, context_len=CTX, batch_size=BS,
                                 tokens_per_shard=3 * CTX)
    assert store.report.shards_done_before == 2
    assert torch.equal(all_of(store, HOOKS[0]), direct(model, rows, HOOKS[0]))


def test_not_enough_free_space_is_refused_before_any_compute(model, rows, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**6, 10**6 - 100, 100))
    with pytest.raises(mi.StoreError, match="only 100 are free; nothing was written"):
        mi.cache_activations(model, rows, HOOKS, tmp_path / "a", context_len=CTX)
    assert not list((tmp_path / "a").glob("shard-*"))


def test_other_inputs_against_an_existing_store_are_refused_unless_overwrite(model, rows, tmp_path):
    out = tmp_path / "a"
    mi.cache_activations(model, rows, HOOKS[:1], out, context_len=CTX, batch_size=BS)
    with pytest.raises(mi.StoreError, match="another inputs_hash"):
        mi.cache_activations(model, rows.flip(0), HOOKS[:1], out, context_len=CTX, batch_size=BS)
    with pytest.raises(mi.StoreError, match="another model"):
        mi.cache_activations(fake_model(seed=1), rows, HOOKS[:1], out, context_len=CTX,
                             batch_size=BS)
    store = mi.cache_activations(model, rows.flip(0), HOOKS[:1], out, context_len=CTX,
                                 batch_size=BS, overwrite=True)
    assert torch.equal(all_of(store, HOOKS[0]), direct(model, rows.flip(0), HOOKS[0]))


def test_bad_input_is_a_typed_error_before_any_compute(model, rows, tmp_path):
    with pytest.raises(mi.HookError, match="blocks.7.hook_resid_post"):
        mi.cache_activations(model, rows, ["blocks.7.hook_resid_post"], tmp_path / "a",
                             context_len=CTX)
    with pytest.raises(mi.ConfigError, match=r"token batch 0 has shape \[11, 8\].*context_len=4"):
        mi.cache_activations(model, rows, HOOKS, tmp_path / "b", context_len=4)
    with pytest.raises(mi.ConfigError, match="texts or token batches, not both"):
        mi.cache_activations(model, [rows, "text"], HOOKS, tmp_path / "c", context_len=CTX)
    assert not list(tmp_path.glob("*/shard-*"))
    store = mi.cache_activations(model, rows, HOOKS[:1], tmp_path / "d", context_len=CTX)
    with pytest.raises(mi.HookError, match="not in the store"):
        next(store.batches("blocks.1.hook_resid_post"))


def test_shuffled_batches_yield_every_token_once_seeded_and_bounded(model, rows, tmp_path):
    store = mi.cache_activations(model, rows, HOOKS[:1], tmp_path / "a", context_len=CTX,
                                 batch_size=BS, tokens_per_shard=3 * CTX)
    ref = all_of(store, HOOKS[0])
    index = {bytes(v.numpy().tobytes()): i for i, v in enumerate(ref)}
    assert len(index) == ref.shape[0]  # every token's vector is distinct

    def order(seed: int, buffer: int) -> list[int]:
        got = list(store.batches(HOOKS[0], batch_size=5, shuffle=True, seed=seed,
                                 buffer_size=buffer))
        assert all(b.shape[0] == 5 for b in got[:-1])
        return [index[bytes(v.numpy().tobytes())] for b in got for v in b]

    a, b, c = order(0, 16), order(0, 16), order(1, 16)
    assert sorted(a) == list(range(ref.shape[0]))  # each token exactly once
    assert a == b and a != c and a != sorted(a)
    assert sorted(order(3, 5)) == list(range(ref.shape[0]))  # buffer of one batch
    sizes = [t.shape[0] for t in store.batches(HOOKS[0], 10, drop_last=True)]
    assert sizes == [10] * (ref.shape[0] // 10)


def test_a_stored_bf16_store_reads_back_in_its_dtype(model, rows, tmp_path):
    store = mi.cache_activations(model, rows, HOOKS[:1], tmp_path / "a", context_len=CTX,
                                 batch_size=BS, dtype=torch.bfloat16)
    got = all_of(store, HOOKS[0])
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, direct(model, rows, HOOKS[0]).to(torch.bfloat16))


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("toy") / "toy"
    write_toy_checkpoint(d)
    return d


TOY_HOOKS = ["blocks.1.hook_resid_post", "blocks.2.hook_mlp_out"]


def _toy_rows() -> torch.Tensor:
    return torch.randint(0, 11, (9, 6), generator=torch.Generator().manual_seed(1))


@pytest.mark.slow
def test_processes_executor_writes_the_same_store(toy_path, tmp_path):
    kw = dict(context_len=6, batch_size=2, tokens_per_shard=12)
    a = mi.cache_activations(toy_path, _toy_rows(), TOY_HOOKS, tmp_path / "a", **kw)
    b = mi.cache_activations(toy_path, _toy_rows(), TOY_HOOKS, tmp_path / "b",
                             executor="processes", workers=2, **kw)
    assert [p.read_bytes() for p in a.shards] == [p.read_bytes() for p in b.shards]


@pytest.mark.slow
def test_ray_executor_writes_the_same_store(toy_path, tmp_path, ray_cluster):
    kw = dict(context_len=6, batch_size=2, tokens_per_shard=12)
    a = mi.cache_activations(toy_path, _toy_rows(), TOY_HOOKS, tmp_path / "a", **kw)
    b = mi.cache_activations(toy_path, _toy_rows(), TOY_HOOKS, tmp_path / "b", executor="ray",
                             workers=2, address=ray_cluster, **kw)
    assert [p.read_bytes() for p in a.shards] == [p.read_bytes() for p in b.shards]
