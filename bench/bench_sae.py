"""SAE encode cost vs a bare ``x @ W_enc + b`` + activation of the same shapes (CPU).

    python bench/bench_sae.py [--d-in 576] [--d-sae 16384] [--tokens 512] [--reps 50]

Prints the median time of each and the ratio (target: <= 1.05). Also times sparse decode
from SparseActivations (top-k) against dense decode.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

import mi_core as mi
from mi_sae import SaeConfig, SparseAutoencoder


def median_ms(fn: Callable[[], object], reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def interleaved(a: Callable[[], object], b: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median ms of a and b, measured in alternating rounds so machine noise hits both."""
    ta, tb = [], []
    for _ in range(5):
        ta.append(median_ms(a, reps // 5 or 1))
        tb.append(median_ms(b, reps // 5 or 1))
    return min(ta), min(tb)


def _bare_topk(h: torch.Tensor, k: int) -> torch.Tensor:
    values, idx = torch.topk(h, k, dim=-1, sorted=False)
    return torch.zeros_like(h).scatter_(-1, idx, values.relu())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--d-in", type=int, default=576)
    ap.add_argument("--d-sae", type=int, default=16384)
    ap.add_argument("--tokens", type=int, default=512, help="4 x 128 by default")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    d_in, d_sae = args.d_in, args.d_sae
    x = torch.randn(4, args.tokens // 4, d_in)
    x2 = x.reshape(-1, d_in)
    W = torch.randn(d_in, d_sae) / d_in ** 0.5
    b = torch.randn(d_sae) * 0.1
    thr = torch.rand(d_sae) * 0.5
    w = {"W_enc": W, "b_enc": b, "W_dec": torch.randn(d_sae, d_in) / d_sae ** 0.5,
         "b_dec": torch.randn(d_in) * 0.1, "threshold": thr}
    hp = mi.HookPoint.parse("blocks.0.hook_resid_post")
    print(f"encode [4, {args.tokens // 4}, {d_in}] -> d_sae={d_sae}, torch threads="
          f"{torch.get_num_threads()}")
    # Two bare baselines per activation: the naive expression and a fused one (addmm, in
    # place); the ratio is against the faster of the two.
    bare_fns: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "relu": (lambda: torch.relu(x @ W + b), lambda: torch.addmm(b, x2, W).relu_()),
        "jumprelu": (lambda: (lambda h: h * (h > thr))(x @ W + b),
                     lambda: (lambda h: h.masked_fill_(h <= thr, 0.0))(torch.addmm(b, x2, W))),
        "topk": (lambda: _bare_topk(x @ W + b, 32), lambda: _bare_topk(torch.addmm(b, x2, W), 32)),
    }
    with torch.inference_mode():
        for act, (naive, fused) in bare_fns.items():
            cfg = SaeConfig(d_in=d_in, d_sae=d_sae, activation=act, architecture=act,  # type: ignore[arg-type]
                            hook_point=hp, k=32 if act == "topk" else None)
            weights = {k: v for k, v in w.items() if k != "threshold" or act == "jumprelu"}
            sae = SparseAutoencoder(cfg, weights, format="bench")
            ours = lambda: sae.encode(x)  # noqa: E731
            t_naive, t_ours = interleaved(naive, ours, args.reps)
            t_fused, t_ours2 = interleaved(fused, ours, args.reps)
            t_bare, t_us = min(t_naive, t_fused), min(t_ours, t_ours2)
            print(f"  {act:9s} bare naive {t_naive:7.2f} ms  bare fused {t_fused:7.2f} ms  "
                  f"mi-sae encode {t_us:7.2f} ms  ratio vs faster bare {t_us / t_bare:.3f}")
        sa = sae.encode_sparse(x)
        f = sa.to_dense()
        t_dense, t_sparse = interleaved(lambda: sae.decode(f), lambda: sae.decode(sa), args.reps)
        print(f"decode k=32: dense [.., d_sae] {t_dense:.2f} ms   sparse {t_sparse:.2f} ms")


if __name__ == "__main__":
    main()
