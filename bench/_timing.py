"""Round-robin timing shared by the benchmarks."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def round_robin(fns: dict[str, Callable[[], object]], reps: int,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median `clock` seconds of each of `fns` over `reps` rounds, taken round-robin
    (A B C, A B C, ...) so that load changes on a shared machine hit every variant alike;
    one warm-up call each first (allocator, lazy init, first touch of mmapped weights)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
    return {k: statistics.median(v) for k, v in times.items()}
