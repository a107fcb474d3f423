"""Experiments at scale on SmolLM2-135M-Instruct (the embedded GGUF), F32, CPU.

1. Sweep overhead: ``mi.run_sweep`` (local executor, one record written + fsynced per job)
   vs a hand-written loop doing the same forward passes.               target <= 1.05x
2. ``mi.cache_activations`` (safetensors shards, writer thread) vs a bare capture of the
   same hooks with the same batching, without writing.                 target >= 0.9x throughput
3. Reading what the stores validate: one pass over an activation store (each shard's size
   and header checked against the manifest), ``store.verify()`` (sha256 of every shard),
   ``load_sweep`` of 5,000 records (each record's fields and key checked).
4. ``executor="ray"`` with 2 workers (a local Ray, one actor and one torch thread each) and
   ``executor="processes"`` with 2 workers vs ``local`` (2 torch threads): speed-up, and
   where the time goes (start-up: Ray / processes + one model load per worker; then jobs).

Timings 1-2 are medians of `--reps` runs taken round-robin (A B, A B, ...), so load changes
on a shared machine hit both alike; `--timer cpu` measures the process's CPU time (all its
threads: the writer thread's work counts) instead of wall time. Printed as markdown.

    .venv/bin/python bench/bench_scale.py [--reps 5] [--jobs 30] [--threads 1] [--timer wall|cpu]
                                          [--skip-ray] [--skip-executors] [--records 5000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

import mi_core as mi

HOOKS = ["blocks.10.hook_resid_post", "blocks.20.hook_resid_post"]
WORDS = ("the cat sat on a mat while seven quiet engineers wrote long reports about rivers "
         "mountains trains and clocks").split()


def prompt_of(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(12))


def forward_job(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    """One forward of a 12-word prompt; the answer is the top next token and its logit."""
    logits = model.forward(model.to_tokens(job["prompt"])).output[0, -1]
    top = int(logits.argmax())
    return {"top": top, "logit": float(logits[top])}


def gguf() -> str:
    from mi_transformer.gguf import default_model_path

    return str(default_model_path())


CLOCK: Callable[[], float] = time.perf_counter


def median_round_robin(fns: dict[str, Callable[[], float]], reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            times[k].append(f())
    return {k: statistics.median(v) for k, v in times.items()}


def bench_sweep(model: mi.MIModel, n_jobs: int, reps: int) -> dict[str, float]:
    jobs = [{"prompt": prompt_of(i), "i": i} for i in range(n_jobs)]

    def hand() -> float:
        t = CLOCK()
        out = [forward_job(model, j) for j in jobs]
        assert len(out) == n_jobs
        return CLOCK() - t

    def sweep() -> float:
        d = Path(tempfile.mkdtemp(prefix="bench_sweep_"))
        t = CLOCK()
        run = mi.run_sweep(forward_job, jobs, model=model, store=d, progress=False)
        dt = CLOCK() - t
        assert len(run.results()) == n_jobs
        shutil.rmtree(d)
        return dt

    hand(), sweep()  # warm-up (first forward, model fingerprint's page cache)
    return median_round_robin({"hand": hand, "sweep": sweep}, reps)


def noop_job(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    return {"i": job["i"]}


def sweep_driver_overhead(model: mi.MIModel, n_jobs: int = 500) -> float:
    """Seconds per job of run_sweep around a function that does nothing: what the store
    (canonical JSON, key, one write per record, background fsync) adds to each job."""
    d = Path(tempfile.mkdtemp(prefix="bench_noop_"))
    t = time.perf_counter()
    mi.run_sweep(noop_job, [{"i": i, "prompt": prompt_of(i)} for i in range(n_jobs)],
                 model=model, store=d, progress=False)
    dt = time.perf_counter() - t
    shutil.rmtree(d)
    return dt / n_jobs


def bench_cache(model: mi.MIModel, rows: int, ctx: int, bs: int, reps: int) -> dict[str, float]:
    ids = torch.randint(100, 40000, (rows, ctx), generator=torch.Generator().manual_seed(0))
    spec = mi.HookSpec().capture_all(HOOKS)

    def bare() -> float:
        t = CLOCK()
        for a in range(0, rows, bs):
            cache = model.forward(ids[a:a + bs], spec)
            for h in HOOKS:
                cache[h].reshape(-1, model.hidden_size)
        return CLOCK() - t

    def store() -> float:
        d = Path(tempfile.mkdtemp(prefix="bench_acts_"))
        t = CLOCK()
        s = mi.cache_activations(model, ids, HOOKS, d, context_len=ctx, batch_size=bs,
                                 tokens_per_shard=2 * bs * ctx, progress=False, verbose=False)
        dt = CLOCK() - t
        assert s.complete
        shutil.rmtree(d)
        return dt

    bare(), store()
    return median_round_robin({"bare": bare, "store": store}, reps)


def bench_reads(model: mi.MIModel, rows: int, ctx: int, n_records: int, reps: int
                ) -> dict[str, float]:
    """What reading costs now that stores are validated: one unshuffled pass over an
    activation store (each shard's size and header checked), ``store.verify()`` (sha256 of
    every shard), and ``load_sweep`` of `n_records` records (each key checked against its
    job). Seconds, medians of `reps`."""
    ids = torch.randint(100, 40000, (rows, ctx), generator=torch.Generator().manual_seed(0))
    d = Path(tempfile.mkdtemp(prefix="bench_reads_"))
    try:
        s = mi.cache_activations(model, ids, HOOKS, d / "acts", context_len=ctx, batch_size=8,
                                 tokens_per_shard=2 * 8 * ctx, progress=False, verbose=False)
        mi.run_sweep(noop_job, [{"i": i, "prompt": prompt_of(i)} for i in range(n_records)],
                     model=model, store=d / "sweep", progress=False)

        def read() -> float:
            t = time.perf_counter()
            for h in HOOKS:
                for _ in s.batches(h, batch_size=4096):
                    pass
            return time.perf_counter() - t

        def timed(f: Callable[[], Any]) -> Callable[[], float]:
            def run() -> float:
                t = time.perf_counter()
                f()
                return time.perf_counter() - t
            return run

        fns = {"read": read, "load_sweep": timed(lambda: mi.load_sweep(d / "sweep"))}
        if hasattr(s, "verify"):
            fns["verify"] = timed(s.verify)
        out = median_round_robin(fns, reps)
        out["bytes"] = float(sum(p.stat().st_size for p in s.shards))
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def bench_executors(path: str, n_jobs: int, skip_ray: bool
                    ) -> list[tuple[str, float, float, float, dict[str, float]]]:
    """(executor, wall, start-up, jobs/s after start-up, start-up parts) per executor."""
    from mi_core.scale import executors as ex_mod

    jobs = [{"prompt": prompt_of(i), "i": i} for i in range(n_jobs)]
    rows = []
    kinds = ["local", "processes"] + ([] if skip_ray else ["ray"])
    for kind in kinds:
        starts: list[float] = []
        cls = {"local": ex_mod.LocalExecutor, "processes": ex_mod.ProcessExecutor,
               "ray": ex_mod.RayExecutor}[kind]
        real_start = cls.start

        parts: dict[str, float] = {}

        def timed(self: Any, hooks: Any, real: Any = real_start) -> None:
            t = time.perf_counter()
            real(self, hooks)
            starts.append(time.perf_counter() - t)
            parts.update(getattr(self, "timings", {}))

        cls.start = timed  # type: ignore[method-assign]
        ex_mod._WORKER_MODELS.clear()  # local loads its model inside start, like a worker
        d = Path(tempfile.mkdtemp(prefix=f"bench_{kind}_"))
        try:
            t = time.perf_counter()
            run = mi.run_sweep(forward_job, jobs, model=path, store=d, executor=kind,
                               workers=None if kind == "local" else 2, progress=False)
            wall = time.perf_counter() - t
        finally:
            cls.start = real_start  # type: ignore[method-assign]
            shutil.rmtree(d, ignore_errors=True)
        assert len(run.results()) == n_jobs
        rows.append((kind, wall, starts[0], n_jobs / (wall - starts[0]), parts))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=30, help="jobs of the sweep benchmarks")
    ap.add_argument("--rows", type=int, default=32, help="rows of the activation benchmark")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the local runs")
    ap.add_argument("--timer", default="wall", choices=["wall", "cpu"])
    ap.add_argument("--executor-jobs", type=int, default=60, help="jobs of the executor runs")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--executors-only", action="store_true", help="only part 4")
    ap.add_argument("--skip-executors", action="store_true", help="parts 1 to 3 only")
    ap.add_argument("--records", type=int, default=5000, help="records of the load_sweep run")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.timer == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    path = gguf()
    model = mi.MIModel.from_pretrained(path)
    print(f"SmolLM2-135M F32, CPU, {torch.get_num_threads()} torch thread(s), "
          f"{os.cpu_count()} cores, {args.timer} time; medians of {args.reps}; load average "
          f"{os.getloadavg()[0]:.1f} at the start\n")

    if not args.executors_only:
        s = bench_sweep(model, args.jobs, args.reps)
        print("| sweep of %d one-forward jobs | time | per job |\n|---|---:|---:|" % args.jobs)
        for k in ("hand", "sweep"):
            print(f"| {k} | {s[k]:.2f} s | {1e3 * s[k] / args.jobs:.1f} ms |")
        print(f"\nsweep / hand-written loop: **{s['sweep'] / s['hand']:.3f}x** (target <= 1.05x)")
        per = sweep_driver_overhead(model)
        print(f"sweep driver overhead per job (a function that does nothing, 500 jobs, start-up "
              f"included): {1e3 * per:.2f} ms = {per / (s['hand'] / args.jobs):.2%} of one job "
              f"above\n")

        ctx, bs = 64, 8
        c = bench_cache(model, args.rows, ctx, bs, args.reps)
        tok = args.rows * ctx
        mb = tok * len(HOOKS) * model.hidden_size * 4 / 2**20
        print(f"| cache {tok} tokens x {len(HOOKS)} hooks ({mb:.0f} MiB) | time | tokens/s |\n"
              "|---|---:|---:|")
        for k in ("bare", "store"):
            print(f"| {k} | {c[k]:.2f} s | {tok / c[k]:.0f} |")
        print(f"\ncache_activations / bare capture throughput: **{c['bare'] / c['store']:.3f}x** "
              f"(target >= 0.9x)\n")

        r = bench_reads(model, args.rows, 64, args.records, args.reps)
        print(f"| reading (validated) | time | rate |\n|---|---:|---:|\n"
              f"| one pass over the store ({r['bytes'] / 2**20:.1f} MiB) | {r['read']:.3f} s | "
              f"{r['bytes'] / 2**20 / r['read']:.0f} MiB/s |")
        if "verify" in r:
            print(f"| `store.verify()` (sha256 of every shard) | {r['verify']:.3f} s | "
                  f"{r['bytes'] / 2**20 / r['verify']:.0f} MiB/s |")
        print(f"| `load_sweep`, {args.records} records | {r['load_sweep']:.3f} s | "
              f"{args.records / r['load_sweep']:.0f} records/s |\n")
    if args.skip_executors:
        return
    rows = bench_executors(path, args.executor_jobs, args.skip_ray)
    local = rows[0]
    print("| executor (%d jobs) | wall | start-up | jobs/s after start-up | speed-up (wall) | "
          "speed-up (jobs) |\n|---|---:|---:|---:|---:|---:|" % args.executor_jobs)
    for kind, wall, start, rate, _ in rows:
        print(f"| {kind} | {wall:.1f} s | {start:.1f} s | {rate:.1f} | {local[1] / wall:.2f}x | "
              f"{rate / local[3]:.2f}x |")
    print("\nstart-up: " + "; ".join(
        f"{kind}: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in parts.items())
        for kind, _, _, _, parts in rows))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
