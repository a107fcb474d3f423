"""How fast `mi` answers: --version, a usage error, a typo, an out-of-range layer (refused
from the GGUF header before any weight loads) against a full command on the embedded
SmolLM2 (which loads the weights). Each is a fresh process, as a user runs it; CPU time of
the child (user + sys, the machine's load does not inflate it) and wall time, medians.

    python bench/bench_cli.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

MI = str(Path(sys.executable).with_name("mi"))
CASES = {
    "mi --version": ["--version"],
    "usage error (--layers x)": ["knockout", "--layers", "x"],
    "typo (mi knockot)": ["knockot"],
    "--layers 30 (refused from the header)": ["knockout", "--layers", "30"],
    "mi knockout (loads the weights, runs)": ["knockout", "-q"],
}


def run(argv: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([MI, *argv], capture_output=True,
                   env={**os.environ, "PYTHONWARNINGS": "ignore"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(f"{'case':42} {'CPU s':>7} {'wall s':>7}  (median of {args.reps})")
    for name, argv in CASES.items():
        runs = [run(argv) for _ in range(args.reps)]
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        print(f"{name:42} {cpu:7.2f} {wall:7.2f}")


if __name__ == "__main__":
    main()
