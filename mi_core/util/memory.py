"""Process memory (RSS) and, when CUDA is available, device memory: snapshots and deltas."""

from __future__ import annotations

import os
import resource
import time

import attrs
import torch


def _rss_bytes() -> int:
    try:  # Linux: current RSS from /proc
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak, best effort


@attrs.define
class MemorySnapshot:
    """RSS and peak RSS of this process; CUDA allocated / reserved / peak when available."""

    time: float
    rss_bytes: int
    peak_rss_bytes: int
    cuda_allocated_bytes: int | None = None
    cuda_reserved_bytes: int | None = None
    cuda_peak_bytes: int | None = None

    @classmethod
    def now(cls) -> "MemorySnapshot":
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        rss = _rss_bytes()
        snap = cls(time.time(), rss, max(peak, rss))  # peak is sampled first: keep it >= rss
        if torch.cuda.is_available():
            snap.cuda_allocated_bytes = int(torch.cuda.memory_allocated())
            snap.cuda_reserved_bytes = int(torch.cuda.memory_reserved())
            snap.cuda_peak_bytes = int(torch.cuda.max_memory_allocated())
        return snap


def _mib(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:.1f} MiB"


@attrs.define
class MemoryReport:
    """Memory before and after a step: ``MemoryReport.measure(label)`` as a context manager."""

    label: str
    before: MemorySnapshot
    after: MemorySnapshot | None = None

    @classmethod
    def measure(cls, label: str = "") -> "MemoryReport":
        return cls(label, MemorySnapshot.now())

    def __enter__(self) -> "MemoryReport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def finish(self) -> "MemoryReport":
        self.after = MemorySnapshot.now()
        return self

    @property
    def rss_delta_bytes(self) -> int:
        after = self.after or MemorySnapshot.now()
        return after.rss_bytes - self.before.rss_bytes

    @property
    def cuda_delta_bytes(self) -> int | None:
        after = self.after or MemorySnapshot.now()
        if after.cuda_allocated_bytes is None or self.before.cuda_allocated_bytes is None:
            return None
        return after.cuda_allocated_bytes - self.before.cuda_allocated_bytes

    def summary(self) -> str:
        after = self.after or MemorySnapshot.now()
        s = (f"{self.label or 'memory'}: RSS {_mib(after.rss_bytes)} "
             f"(delta {self.rss_delta_bytes / 2**20:+.1f} MiB, peak {_mib(after.peak_rss_bytes)})")
        if after.cuda_allocated_bytes is not None:
            s += (f"; CUDA allocated {_mib(after.cuda_allocated_bytes)}, "
                  f"peak {_mib(after.cuda_peak_bytes)}")
        return s
