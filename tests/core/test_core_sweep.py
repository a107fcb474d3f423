"""mi.run_sweep / mi.load_sweep: resumable, crash-safe sweeps on the toy checkpoint (example
plugin). Results are checked against the toy model's independent reference forward
(tests.support.toy_checkpoint.toy_reference, max abs diff < 1e-5 in F32) and, across
executors, for exact equality."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.scale import store as store_mod
from tests.support import sweep_fns
from tests.support.sweep_fns import (
    TOY_JOBS, fails_on_odd, toy_logits, toy_logits_batched, toy_reference,
)
from tests.support.ray_cluster import ray_cluster  # noqa: F401 - fixture
from tests.support.sweep_fns import node_of as _node_of
from tests.support.toy_checkpoint import write_toy_checkpoint

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    d = tmp_path_factory.mktemp("toy") / "toy"
    return d, write_toy_checkpoint(d)


def _keys_on_disk(store: Path) -> Counter:
    c: Counter = Counter()
    for part in sorted(store.glob("part-*.jsonl")):
        for line in part.read_text().splitlines():
            rec = json.loads(line)
            if rec["ok"]:
                c[rec["key"]] += 1
    return c


def _close(a: dict, b: dict, tol: float = 1e-5) -> bool:
    return all(max(abs(x - y) for x, y in zip(a[k], b[k])) < tol for k in a)


def test_results_match_the_reference_forward_in_job_order(toy, tmp_path):
    path, weights = toy
    run = mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=tmp_path / "s")
    res = run.results()
    assert [j for j, _ in res] == TOY_JOBS and not run.failed() and run.complete
    for job, r in res:
        assert _close(r, toy_reference(weights, job))
    again = mi.load_sweep(tmp_path / "s")
    assert again.results() == res


def test_equal_jobs_are_one_job_and_progress_shows_done_of_total(toy, tmp_path, capsys):
    path, _ = toy
    run = mi.run_sweep(toy_logits, TOY_JOBS[:6] + [dict(TOY_JOBS[0])], model=path,
                       store=tmp_path / "s", progress=True)
    assert run.total == 6 and len(run.results()) == 6
    assert "6/6" in capsys.readouterr().err  # tqdm: done/total, rate and ETA


def test_rerun_skips_finished_jobs_and_extends(toy, tmp_path):
    path, _ = toy
    calls = sweep_fns.CALLS
    calls.clear()
    mi.run_sweep(sweep_fns.counted_toy, TOY_JOBS[:10], model=path, store=tmp_path / "s")
    run = mi.run_sweep(sweep_fns.counted_toy, TOY_JOBS, model=path, store=tmp_path / "s")
    assert len(calls) == 24 and len(run.results()) == 24  # 10 + the 14 new ones
    mi.run_sweep(sweep_fns.counted_toy, TOY_JOBS, model=path, store=tmp_path / "s")
    assert len(calls) == 24
    assert set(_keys_on_disk(tmp_path / "s").values()) == {1}


def test_batch_size_gives_the_same_results_as_single_jobs(toy, tmp_path):
    path, _ = toy
    one = mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=tmp_path / "a").results()
    seen = []

    def batched(model, jobs):
        seen.append(len(jobs))
        return toy_logits_batched(model, jobs)

    many = mi.run_sweep(batched, TOY_JOBS, model=path, store=tmp_path / "b", batch_size=5).results()
    assert seen == [5, 5, 5, 5, 4]
    for (j1, r1), (j2, r2) in zip(one, many):
        assert j1 == j2 and _close(r1, r2, 1e-5)


def test_failing_jobs_are_retried_recorded_and_the_sweep_goes_on(toy, tmp_path):
    path, _ = toy
    attempts = Counter()

    def flaky(model, job):
        attempts[job["ids"][0]] += 1
        return fails_on_odd(model, job)

    run = mi.run_sweep(flaky, TOY_JOBS, model=path, store=tmp_path / "s", retries=2)
    odd = [j for j in TOY_JOBS if j["ids"][0] % 2]
    assert [j for j, _ in run.failed()] == odd
    assert all("ValueError: odd first token" in e for _, e in run.failed())
    assert len(run.results()) == len(TOY_JOBS) - len(odd)
    assert all(attempts[j["ids"][0]] % 3 == 0 for j in odd)  # 1 try + 2 retries each
    # a later run with a fixed function (new store: the function changed) has no failures
    assert not mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=tmp_path / "t").failed()


def test_a_failed_job_is_tried_again_on_resume_and_its_result_supersedes_the_error(toy, tmp_path):
    path, _ = toy
    sometimes = sweep_fns.sometimes_fails  # its switch is a module global: not its identity
    sweep_fns.STATE["fail"] = True
    run = mi.run_sweep(sometimes, TOY_JOBS, model=path, store=tmp_path / "s", retries=0)
    assert len(run.failed()) == 3  # ids[0] == 1 for jobs 1, 12, 23
    sweep_fns.STATE["fail"] = False
    run = mi.run_sweep(sometimes, TOY_JOBS, model=path, store=tmp_path / "s", retries=0)
    assert not run.failed() and len(run.results()) == 24
    assert not mi.load_sweep(tmp_path / "s").failed()


def test_structured_results_round_trip_through_cattrs(toy, tmp_path):
    path, _ = toy

    def structured(model, job):
        r = toy_logits(model, job)
        return mi.TokenPrediction(int(torch.tensor(r["last_logits"]).argmax()), "?", 0.5,
                                  max(r["last_logits"]), 0)

    run = mi.run_sweep(structured, TOY_JOBS[:3], model=path, store=tmp_path / "s")
    res = run.results(as_type=mi.TokenPrediction)
    assert all(isinstance(r, mi.TokenPrediction) for _, r in res)
    assert res[0][1].rank == 0 and res[0][1].prob == 0.5


@pytest.mark.slow
def test_killed_run_loses_only_in_flight_jobs_and_resumes_without_duplicates(toy, tmp_path):
    path, weights = toy
    store = tmp_path / "s"
    n = 300
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for min_lines in (5, 40):  # kill early, then again after the first resume began
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.sweep_fns", str(path),
                                 str(store), str(n)], cwd=ROOT, env=env)
        deadline = time.time() + 60
        while time.time() < deadline:
            if sum(_keys_on_disk(store).values()) >= min_lines if store.exists() else False:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        partial = mi.load_sweep(store)  # readable as is, possibly with a torn last line
        assert 0 < len(partial.results()) < n
        assert set(_keys_on_disk(store).values()) == {1}
    jobs = [{"ids": [i % 11, 1, 2], "n": i} for i in range(n)]
    run = mi.run_sweep(sweep_fns.slow_toy, jobs, model=path, store=store)
    assert len(run.results()) == n and run.complete
    keys = _keys_on_disk(store)
    assert len(keys) == n and set(keys.values()) == {1}
    job, r = run.results()[-1]
    assert _close(r, toy_reference(weights, job))


def test_torn_last_line_is_ignored_by_readers_and_truncated_by_the_next_writer(toy, tmp_path):
    path, _ = toy
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:5], model=path, store=store)
    part = sorted(store.glob("part-*.jsonl"))[-1]
    good = part.read_bytes()
    line = good.splitlines()[0]
    part.write_bytes(good + line[: len(line) // 2])  # a write cut in the middle
    assert len(mi.load_sweep(store).results()) == 5
    assert part.read_bytes() != good  # readers do not repair
    run = mi.run_sweep(toy_logits, TOY_JOBS[:8], model=path, store=store)
    assert part.read_bytes() == good and len(run.results()) == 8


def test_corruption_before_the_last_line_is_refused(toy, tmp_path):
    path, _ = toy
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:3], model=path, store=store)
    part = sorted(store.glob("part-*.jsonl"))[0]
    lines = part.read_bytes().splitlines(keepends=True)
    part.write_bytes(lines[0] + b"garbage\n" + b"".join(lines[1:]))
    with pytest.raises(mi.StoreError, match=r"part-00000.jsonl: line 2: not valid JSON.*corrupt"):
        mi.load_sweep(store)


def test_full_disk_raises_typed_error_and_keeps_every_written_record(toy, tmp_path, monkeypatch):
    path, _ = toy
    store = tmp_path / "s"
    real = store_mod.write_all
    calls = {"n": 0}

    def failing(fd, data):
        calls["n"] += 1
        if calls["n"] == 6:
            real(fd, data[: len(data) // 2])  # part of the line reaches the disk, then ENOSPC
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(store_mod, "write_all", failing)
    with pytest.raises(mi.StoreError, match="the disk is full.*5 results recorded before"):
        mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=store)
    monkeypatch.setattr(store_mod, "write_all", real)
    for part in store.glob("part-*.jsonl"):
        assert part.read_bytes().endswith(b"\n")  # the half line was truncated away
    assert len(mi.load_sweep(store).results()) == 5
    run = mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=store)
    assert len(run.results()) == 24 and set(_keys_on_disk(store).values()) == {1}


def test_job_that_is_not_json_able_is_refused_before_anything_runs(toy, tmp_path):
    path, _ = toy
    with pytest.raises(mi.SweepError, match=r"job 1 is not JSON-able"):
        mi.run_sweep(toy_logits, [TOY_JOBS[0], {"ids": torch.tensor([1])}], model=path,
                     store=tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_result_that_is_not_json_able_is_a_recorded_failure(toy, tmp_path):
    path, _ = toy
    run = mi.run_sweep(lambda m, j: {"x": object()}, TOY_JOBS[:2], model=path,
                       store=tmp_path / "s", retries=0)
    assert len(run.failed()) == 2 and "not JSON-able" in run.failed()[0][1]


def test_changed_function_or_model_is_refused_unless_overwrite(toy, tmp_path):
    path, _ = toy
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:4], model=path, store=store)
    with pytest.raises(mi.StoreError, match="another function"):
        mi.run_sweep(toy_logits_batched, TOY_JOBS[:4], model=path, store=store, batch_size=2)
    other = tmp_path / "toy2"
    write_toy_checkpoint(other, seed=1)
    with pytest.raises(mi.StoreError, match="another model"):
        mi.run_sweep(toy_logits, TOY_JOBS[:4], model=other, store=store)
    run = mi.run_sweep(toy_logits, TOY_JOBS[:4], model=other, store=store, overwrite=True)
    assert len(run.results()) == 4 and sum(_keys_on_disk(store).values()) == 4


def test_store_of_another_format_or_mi_core_version_is_refused(toy, tmp_path):
    path, _ = toy
    store = tmp_path / "s"
    mi.run_sweep(toy_logits, TOY_JOBS[:2], model=path, store=store)
    man = json.loads((store / "manifest.json").read_text())
    (store / "manifest.json").write_text(json.dumps({**man, "mi_core_version": "0.0.1"}))
    with pytest.raises(mi.StoreError, match="another mi-core version"):
        mi.run_sweep(toy_logits, TOY_JOBS[:2], model=path, store=store)
    (store / "manifest.json").write_text(json.dumps({**man, "format_version": 99}))
    with pytest.raises(mi.StoreError, match="format version 99"):
        mi.load_sweep(store)


def test_hook_the_model_lacks_is_an_error_before_any_job(toy, tmp_path):
    path, _ = toy
    ran = []
    with pytest.raises(mi.HookError, match="blocks.0.attn.hook_pattern"):
        mi.run_sweep(lambda m, j: ran.append(j) or {}, TOY_JOBS, model=path,
                     store=tmp_path / "s", hooks=["blocks.0.hook_resid_post",
                                                  "blocks.0.attn.hook_pattern"])
    assert not ran and not list((tmp_path / "s").glob("part-*"))


def test_a_second_writer_of_one_store_is_refused(toy, tmp_path):
    path, _ = toy
    store = tmp_path / "s"
    store.mkdir()
    from mi_core.scale._fs import StoreDir, StoreLock

    with StoreDir(store) as d, StoreLock(d):
        with pytest.raises(mi.StoreError, match="another process is writing"):
            mi.run_sweep(toy_logits, TOY_JOBS[:2], model=path, store=store)


def test_processes_executor_refuses_a_loaded_model_and_a_lambda(toy, toy_model_loaded, tmp_path):
    with pytest.raises(mi.ConfigError, match="pass the model as a path"):
        mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy_model_loaded, store=tmp_path / "a",
                     executor="processes")
    with pytest.raises(mi.ConfigError, match="unknown executor 'threads'"):
        mi.run_sweep(toy_logits, TOY_JOBS[:2], model=toy[0], store=tmp_path / "b",
                     executor="threads")


@pytest.fixture(scope="module")
def toy_model_loaded(toy) -> mi.MIModel:
    return mi.MIModel.from_pretrained(toy[0])


def test_local_model_object_and_path_share_one_store(toy, toy_model_loaded, tmp_path):
    path, _ = toy
    mi.run_sweep(toy_logits, TOY_JOBS[:5], model=toy_model_loaded, store=tmp_path / "s")
    run = mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=tmp_path / "s")
    assert len(run.results()) == 24


def test_core_import_does_not_import_ray():
    code = "import sys, mi_core; mi_core.run_sweep; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.slow
def test_processes_executor_gives_the_local_results(toy, tmp_path):
    path, _ = toy
    local = mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=tmp_path / "a").results()
    procs = mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=tmp_path / "b",
                         executor="processes", workers=2).results()
    assert procs == local  # exact: same model, same inputs, one thread each
    with pytest.raises(mi.SweepError, match="cannot be sent to worker processes"):
        mi.run_sweep(lambda m, j: {}, TOY_JOBS, model=path, store=tmp_path / "c",
                     executor="processes", workers=1)
    with pytest.raises(mi.HookError, match="blocks.9.hook_resid_post"):
        mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=tmp_path / "d",
                     executor="processes", workers=1, hooks=["blocks.9.hook_resid_post"])


@pytest.mark.slow
def test_ray_executor_on_a_two_node_cluster_gives_the_local_results(toy, tmp_path, ray_cluster):
    import ray

    path, _ = toy
    local = mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=tmp_path / "a").results()
    run = mi.run_sweep(toy_logits, TOY_JOBS, model=path, store=tmp_path / "b", executor="ray",
                       workers=2, address=ray_cluster)
    assert run.results() == local  # exact
    assert not ray.is_initialized()  # the executor started Ray, so it shut it down
    nodes = {r["node"] for _, r in mi.run_sweep(
        _node_of, [{"i": i} for i in range(8)], model=path, store=tmp_path / "c",
        executor="ray", workers=2, address=ray_cluster).results()}
    assert len(nodes) == 2  # one actor per node: the work really spread over both
