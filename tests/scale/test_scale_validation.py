"""Stores are validated: a damaged or foreign activation shard, a manifest that is not one, or
a sweep record that is not what mi-core writes is a StoreError naming the file and the field;
sweep results are strict JSON (NaN, infinities, lone surrogates, duplicate keys become the
job's error, and the run goes on); ``cache_activations(dtype=float16)`` refuses values that
overflow float16, naming the hook point and the shard."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import mi_core as mi
from tests.support.fake_backend import fake_model
from tests.support.sweep_fns import TOY_JOBS, toy_logits
from tests.support.toy_checkpoint import write_toy_checkpoint

HOOK = "blocks.0.hook_resid_post"
CTX = 8


@pytest.fixture(scope="module")
def model() -> mi.MIModel:
    return fake_model(seed=0)


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("toy") / "toy"
    write_toy_checkpoint(d)
    return d


def cache(model: mi.MIModel, out: Path, **kw) -> mi.ActivationStore:
    """Three shards of two rows (16 tokens each)."""
    rows = torch.randint(1, 250, (6, CTX), generator=torch.Generator().manual_seed(0))
    return mi.cache_activations(model, rows, [HOOK], out, context_len=CTX, batch_size=2,
                                tokens_per_shard=2 * CTX, verbose=False, **kw)


@pytest.fixture(scope="module")
def built(model: mi.MIModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("built") / "a"
    cache(model, out)
    return out


def copy_of(built: Path, tmp_path: Path) -> mi.ActivationStore:
    """A fresh copy of the module's store to damage (writing one costs a few forwards)."""
    shutil.copytree(built, tmp_path / "a")
    return mi.ActivationStore(tmp_path / "a")


def rewrite(path: Path, change) -> None:
    """Re-save a shard with safetensors after `change(tensors, metadata)`."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))["__metadata__"]
    tensors = load_file(str(path))
    change(tensors, meta)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)


def read_all(out: Path) -> None:
    list(mi.ActivationStore(out).batches(HOOK, batch_size=100))


# -- activation shards --------------------------------------------------------------------------

def test_manifest_records_index_token_range_size_and_checksums(built, tmp_path):
    import hashlib

    store = copy_of(built, tmp_path)
    for i, (s, p) in enumerate(zip(store.manifest["shards"], store.shards)):
        data = p.read_bytes()
        assert s["index"] == i and s["token_range"] == [16 * i, 16 * (i + 1)]
        assert s["bytes"] == len(data) and s["sha256"] == hashlib.sha256(data).hexdigest()
        (n,) = struct.unpack("<Q", data[:8])
        assert s["header_sha256"] == hashlib.sha256(data[:8 + n]).hexdigest()
    store.verify()  # the full-content check passes on an untouched store


def test_a_finished_shard_without_its_checksum_gets_it_on_resume(model, built, tmp_path):
    """A run killed between a shard's rename and the manifest update leaves the shard
    without `sha256`; the next run checks the shard's header and records its sum."""
    out = copy_of(built, tmp_path).directory
    man = json.loads((out / "manifest.json").read_text())
    want = man["shards"][1].pop("sha256")
    (out / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(mi.StoreError, match=r"shard-00001.*sha256: no content checksum"):
        mi.ActivationStore(out).verify()
    assert cache(model, out).report.shards_done_before == 3
    assert mi.ActivationStore(out).manifest["shards"][1]["sha256"] == want


def test_swapped_shards_are_refused_naming_the_index(built, tmp_path):
    store = copy_of(built, tmp_path)
    a, b = store.shards[0], store.shards[1]
    tmp = a.with_name("x")
    a.rename(tmp), b.rename(a), tmp.rename(b)  # tokens out of order, labels misaligned
    with pytest.raises(mi.StoreError, match=r"shard-00000\.safetensors \(shard 0\): index: the "
                       r"file is shard '1'"):
        read_all(tmp_path / "a")


def test_a_float16_shard_in_a_float32_store_is_refused_naming_the_dtype(built, tmp_path):
    store = copy_of(built, tmp_path)
    rewrite(store.shards[1], lambda t, m: t.update({HOOK: t[HOOK].half()}))
    with pytest.raises(mi.StoreError, match=r"shard-00001.*dtype of 'blocks.0.hook_resid_post': "
                       r"'F16', the store holds F32"):
        read_all(tmp_path / "a")


def test_a_shard_of_another_width_or_fewer_tokens_is_refused_naming_the_shape(built, tmp_path):
    store = copy_of(built, tmp_path)
    rewrite(store.shards[2], lambda t, m: t.update({HOOK: torch.cat([t[HOOK]] * 2, 1)}))
    with pytest.raises(mi.StoreError, match=r"shard-00002.*shape of 'blocks.0.hook_resid_post': "
                       r"\[16, 64\], expected \[16, 32\]"):
        read_all(tmp_path / "a")
    rewrite(store.shards[2], lambda t, m: t.update({HOOK: t[HOOK][:10, :32],
                                                    "tokens": t["tokens"][:10]}))
    with pytest.raises(mi.StoreError, match=r"shard-00002.*shape of 'blocks.0.hook_resid_post': "
                       r"\[10, 32\], expected \[16, 32\]"):
        read_all(tmp_path / "a")


def test_truncated_and_garbage_shards_are_refused_naming_the_field(model, built, tmp_path):
    store = copy_of(built, tmp_path)
    data = store.shards[0].read_bytes()
    store.shards[0].write_bytes(data[:-100])
    with pytest.raises(mi.StoreError, match=r"shard-00000.*size: \d+ bytes, the manifest expects "
                       r"\d+ \(truncated\)"):
        read_all(tmp_path / "a")
    with pytest.raises(mi.StoreError, match=r"shard-00000.*size.*truncated"):
        cache(model, tmp_path / "a")  # resuming checks the finished shards too
    store.shards[0].write_bytes(b"\xff" * 8 + data[8:])
    with pytest.raises(mi.StoreError, match=r"shard-00000.*header: not a safetensors header"):
        read_all(tmp_path / "a")
    store.shards[0].write_bytes(data[:8] + b"{garbage" + data[16:])
    with pytest.raises(mi.StoreError, match=r"shard-00000.*header: not a safetensors header"):
        read_all(tmp_path / "a")
    store.shards[0].write_bytes(b"")
    with pytest.raises(mi.StoreError, match=r"shard-00000.*too short"):
        read_all(tmp_path / "a")


def test_changed_content_passes_the_fast_check_and_fails_verify(built, tmp_path):
    store = copy_of(built, tmp_path)
    data = bytearray(store.shards[1].read_bytes())
    data[-50] ^= 0xFF  # one flipped byte in the data: header and size unchanged
    store.shards[1].write_bytes(bytes(data))
    read_all(tmp_path / "a")  # the per-read check is header + size only (documented)
    with pytest.raises(mi.StoreError, match=r"shard-00001.*sha256: the content differs"):
        mi.ActivationStore(tmp_path / "a").verify()


def test_a_shard_of_other_tokens_is_refused(model, built, tmp_path):
    """Same shapes, same index, other input ids (a shard of another store): the header's
    checksum differs, and the error says the header is not the one planned."""
    a = copy_of(built, tmp_path)
    other = tmp_path / "b"
    ids = torch.randint(1, 250, (6, CTX), generator=torch.Generator().manual_seed(1))
    mi.cache_activations(model, ids, [HOOK], other, context_len=CTX, batch_size=2,
                         tokens_per_shard=2 * CTX, verbose=False)
    a.shards[1].write_bytes((other / "shard-00001.safetensors").read_bytes())
    with pytest.raises(mi.StoreError, match=r"shard-00001.*header checksum"):
        read_all(tmp_path / "a")


@pytest.mark.parametrize("edit, match", [
    (lambda m: [m], r"the manifest: expected a JSON object, got list"),
    (lambda m: {k: v for k, v in m.items() if k != "hooks"}, r"hooks: expected an object"),
    (lambda m: {**m, "hooks": {HOOK: {**m["hooks"][HOOK], "dtype": "float8"}}},
     r"hooks\['blocks.0.hook_resid_post'\]\.dtype: 'float8'"),
    (lambda m: {**m, "shards": m["shards"][:2]}, r"shards: they cover 4 rows, the store has 6"),
    (lambda m: {**m, "shards": [m["shards"][1], m["shards"][0], m["shards"][2]]},
     r"shards\[0\]\.index: 1, expected 0"),
    (lambda m: {**m, "context_len": "8"}, r"context_len: '8' is not an integer"),
    (lambda m: {**m, "format_version": 1}, r"not an activation store of format .* version 2"),
])
def test_a_bad_manifest_is_a_store_error_naming_the_key(model, built, tmp_path, edit, match):
    out = copy_of(built, tmp_path).directory
    man = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps(edit(man)))
    with pytest.raises(mi.StoreError, match=match):
        mi.ActivationStore(out)
    with pytest.raises(mi.StoreError, match=match):
        cache(model, out)  # a resume reads it the same way


def test_a_manifest_with_nan_or_duplicate_keys_is_not_json(built, tmp_path):
    out = copy_of(built, tmp_path).directory
    text = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(text.replace('"rows": 6', '"rows": NaN'))
    with pytest.raises(mi.StoreError, match="manifest.json: not valid JSON .*NaN is not JSON"):
        mi.ActivationStore(out)
    (out / "manifest.json").write_text(text.replace('"rows": 6', '"rows": 6, "rows": 7'))
    with pytest.raises(mi.StoreError, match="duplicate key 'rows'"):
        mi.ActivationStore(out)


# -- dtype overflow -------------------------------------------------------------------------------

def test_float16_overflow_is_refused_naming_the_hook_and_the_shard(tmp_path):
    """The toy model's residual is its embedding plus tanh terms (|tanh| <= 1 per layer), so
    embeddings scaled to ~1e5 put resid values beyond float16's 65504."""
    ckpt = tmp_path / "big"
    weights = write_toy_checkpoint(ckpt)
    weights["embed"] = weights["embed"] * 1e5
    save_file(weights, str(ckpt / "model.safetensors"))
    rows = torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(0))
    kw = dict(context_len=6, batch_size=2, tokens_per_shard=12, verbose=False)
    with pytest.raises(mi.StoreError, match=r"shard-00000\.safetensors \(rows 0\.\.2\).*hook "
                       r"point 'blocks\.1\.hook_resid_post': \d+ of 96 values overflow the "
                       r"store's dtype float16 \(largest magnitude [\d.e+]+; it holds at most "
                       r"65504\)"):
        mi.cache_activations(ckpt, rows, ["blocks.1.hook_resid_post"], tmp_path / "a",
                             dtype=torch.float16, **kw)
    assert not list((tmp_path / "a").glob("shard-*"))  # nothing with an inf was kept
    store = mi.cache_activations(ckpt, rows, ["blocks.1.hook_resid_post"], tmp_path / "b",
                                 dtype=torch.bfloat16, **kw)  # bfloat16 has float32's range
    got = torch.cat(list(store.batches("blocks.1.hook_resid_post", 100)))
    assert torch.isfinite(got).all() and got.abs().max() > 65504


def test_integer_storage_of_float_activations_is_refused(model, tmp_path):
    with pytest.raises(mi.ConfigError, match=r"'blocks.0.hook_resid_post' is float32.*not "
                       r"torch.int8 \(values would be truncated\)"):
        cache(model, tmp_path / "a", dtype=torch.int8)


# -- sweep records -------------------------------------------------------------------------------

def part_lines(store: Path) -> list[dict]:
    return [json.loads(ln) for ln in (store / "part-00000.jsonl").read_text().splitlines()]


def write_lines(store: Path, lines: list) -> None:
    (store / "part-00000.jsonl").write_text(
        "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))


@pytest.mark.parametrize("edit, match", [
    (lambda r, o: {**r, "key": o["key"]}, r"field 'key': '[0-9a-f]+' is not the key of its job"),
    (lambda r, o: {**r, "ok": "false"}, r"field 'ok': 'false' is not true or false"),
    (lambda r, o: {**r, "index": -1}, r"field 'index': -1 is not an integer >= 0"),
    (lambda r, o: {**r, "attempts": "1"}, r"field 'attempts': '1' is not an integer"),
    (lambda r, o: {**r, "error": "boom"}, r"field 'error': a result has no error"),
    (lambda r, o: {**r, "extra": 1}, r"field 'record': fields \["),
    (lambda r, o: [r], r"field 'record': expected a JSON object, got list"),
])
def test_a_record_that_mi_core_did_not_write_is_refused(toy, tmp_path, edit, match):
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:3], model=toy, store=store)
    recs = part_lines(store)
    write_lines(store, [edit(recs[0], recs[1])] + recs[1:])  # not the last line: no torn write
    with pytest.raises(mi.StoreError, match=r"part-00000\.jsonl: line 1: " + match):
        mi.load_sweep(store)
    with pytest.raises(mi.StoreError, match=r"part-00000\.jsonl: line 1: " + match):
        mi.run_sweep(toy_logits, TOY_JOBS[:3], model=toy, store=store)


def test_a_bad_last_record_is_refused_not_truncated_as_torn(toy, tmp_path):
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    recs = part_lines(store)
    write_lines(store, recs[:1] + [{**recs[1], "ok": 0}])
    before = (store / "part-00000.jsonl").read_bytes()
    with pytest.raises(mi.StoreError, match=r"line 2: field 'ok': 0 is not true or false"):
        mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    assert (store / "part-00000.jsonl").read_bytes() == before


def test_a_nan_line_in_a_part_is_corruption(toy, tmp_path):
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    recs = part_lines(store)
    line = json.dumps({**recs[0], "result": {"x": 1.0}}).replace("1.0", "NaN")
    write_lines(store, [line] + recs[1:])
    with pytest.raises(mi.StoreError, match=r"line 1: not valid JSON \(NaN is not JSON\)"):
        mi.load_sweep(store)


def weird(model, job):
    """Results strict JSON cannot hold, by job; the others are fine."""
    n = job["n"]
    return [{"x": float("nan")}, {"x": float("inf")}, {"x": "a\ud800b"}, {1: "a", "1": "b"},
            {"x": 1}][n]


def test_non_json_results_are_the_jobs_errors_and_the_run_goes_on(toy, tmp_path):
    store = tmp_path / "s"
    jobs = [{"n": i} for i in range(5)]
    run = mi.run_sweep(weird, jobs, model=toy, store=store, retries=0)
    assert run.results() == [({"n": 4}, {"x": 1})]
    errors = dict((j["n"], e) for j, e in run.failed())
    assert "Out of range float values are not JSON compliant" in errors[0]
    assert "Out of range float values are not JSON compliant" in errors[1]
    assert "lone surrogate (U+D800" in errors[2]
    assert "duplicate key '1'" in errors[3]
    def no_constant(name):
        raise AssertionError(f"{name} written into the store")

    for line in (store / "part-00000.jsonl").read_text(encoding="utf-8").splitlines():
        json.loads(line, parse_constant=no_constant)  # strict JSON, valid UTF-8
    again = mi.load_sweep(store)  # everything written loads back strictly
    assert again.results() == run.results() and len(again.failed()) == 4


def test_in_a_batch_only_the_job_with_a_non_json_result_fails(toy, tmp_path):
    def batch(model, jobs):
        return [weird(model, j) for j in jobs]

    jobs = [{"n": 4, "k": 0}, {"n": 0}, {"n": 4, "k": 1}]
    run = mi.run_sweep(batch, jobs, model=toy, store=tmp_path / "s", batch_size=3)
    assert [j for j, _ in run.results()] == [jobs[0], jobs[2]]
    assert [j for j, _ in run.failed()] == [jobs[1]]


def raises_surrogate(model, job):
    raise ValueError("bad \udcff byte")


def test_an_error_text_with_a_lone_surrogate_is_recorded_escaped(toy, tmp_path):
    run = mi.run_sweep(raises_surrogate, [{"n": 0}], model=toy, store=tmp_path / "s",
                       retries=0)
    (_, err), = run.failed()
    assert "bad \\udcff byte" in err
    err.encode("utf-8")  # printable, writable
    assert mi.load_sweep(tmp_path / "s").failed() == run.failed()


def test_a_job_with_a_lone_surrogate_is_refused_before_anything_runs(toy, tmp_path):
    with pytest.raises(mi.SweepError, match=r"job 1 holds a lone surrogate \(U\+D800"):
        mi.run_sweep(toy_logits, [TOY_JOBS[0], {"ids": [1], "t": "\ud800"}], model=toy,
                     store=tmp_path / "s")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("edit, match", [
    (lambda m: [m], r"not a sweep store manifest \(format None"),
    (lambda m: {k: v for k, v in m.items() if k != "fn"}, r"fn: expected an object"),
    (lambda m: {**m, "batch_size": "2"}, r"batch_size: '2' is not null"),
    (lambda m: {**m, "model": {"source": 1}}, r"model: expected an object with string"),
])
def test_a_bad_sweep_manifest_is_a_store_error_naming_the_key(toy, tmp_path, edit, match):
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy, store=store)
    man = json.loads((store / "manifest.json").read_text())
    (store / "manifest.json").write_text(json.dumps(edit(man)))
    with pytest.raises(mi.StoreError, match=r"manifest\.json: " + match):
        mi.load_sweep(store)
