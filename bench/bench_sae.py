"""SAE encode cost vs a bare ``x @ W_enc + b`` + activation of the same shapes (CPU).

    python bench/bench_sae.py [--d-in 576] [--d-sae 16384] [--tokens 512] [--reps 50]
                              [--threads N]

Prints the median time of each and the ratio mi-sae / bare (target: <= 1.05) against a
naive bare expression and a fused one (addmm + in-place activation). Also times sparse
decode from SparseActivations (top-k) against dense decode.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

import mi_core as mi
from mi_sae import SaeConfig, SparseAutoencoder


def interleaved(a: Callable[[], object], b: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median ms of a and b over `reps` calls each, alternating a/b call by call (order
    swapped every round) so load from other processes hits both equally."""
    for _ in range(3):
        a()
        b()
    ta: list[float] = []
    tb: list[float] = []
    for i in range(reps):
        for fn, out in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


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
    # place); each is timed paired (alternating calls) with mi-sae's encode.
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
            print(f"  {act:9s} bare naive {t_naive:7.2f} ms (ours {t_ours:7.2f}, ratio "
                  f"{t_ours / t_naive:.3f})   bare fused {t_fused:7.2f} ms (ours {t_ours2:7.2f}, "
                  f"ratio {t_ours2 / t_fused:.3f})")
        sa = sae.encode_sparse(x)
        f = sa.to_dense()
        t_dense, t_sparse = interleaved(lambda: sae.decode(f), lambda: sae.decode(sa), args.reps)
        print(f"decode k=32: dense [.., d_sae] {t_dense:.2f} ms   sparse {t_sparse:.2f} ms")


if __name__ == "__main__":
    main()
