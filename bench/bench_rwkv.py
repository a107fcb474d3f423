"""Sequence-mode forward of mi-rwkv against the `rwkv` package on the same random weights.

Model: 6 layers x 512 hidden (head size 64, 8 heads), vocab 8192; input 4 sequences x 256
tokens, F32, CPU. mi-rwkv runs the batch in one call (chunked WKV); `rwkv` (strategy
'cpu fp32', TorchScript on, its per-token WKV loop inside each layer) has no batch
dimension, so it runs the 4 sequences one after another. Reports the median of `--reps`
runs of each, taken alternately.

    .venv/bin/python bench/bench_rwkv.py [--version 6|7|both] [--reps 3] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests.support

from tests.support import rwkv_ckpt  # noqa: E402

import mi_core as mi  # noqa: E402
from _timing import round_robin  # noqa: E402  (bench/ is on sys.path when run as a script)

LAYERS, HIDDEN, HEAD, VOCAB, BATCH, SEQ = 6, 512, 64, 8192, 4, 256


def _time_pair(a, b, reps: int) -> tuple[float, float]:
    """Median seconds of `a` and of `b`, measured alternately (a loaded machine drifts)."""
    t = round_robin({"a": a, "b": b}, reps)  # one warm-up each: TorchScript, allocator
    return t["a"], t["b"]


def bench(version: int, reps: int, workdir: Path) -> dict[str, float]:
    v7 = version == 7
    if v7:
        w = rwkv_ckpt.v7_tensors(LAYERS, HIDDEN, HEAD, VOCAB, dr=64, ar=64, vr=32, gr=128)
        cfg = rwkv_ckpt.v7_config(LAYERS, HIDDEN, HEAD, VOCAB, dr=64, ar=64, vr=32, gr=128)
        blink = rwkv_ckpt.to_blinkdl_v7(w, LAYERS)
    else:
        w, cfg = rwkv_ckpt.v6_tensors(LAYERS, HIDDEN, HEAD, VOCAB), rwkv_ckpt.v6_config(LAYERS, HIDDEN, HEAD, VOCAB)
        blink = rwkv_ckpt.to_blinkdl_v6(w)
    d = rwkv_ckpt.write_checkpoint(workdir / f"v{version}", w, cfg)
    model = mi.MIModel.from_pretrained(d)
    ref = rwkv_ckpt.reference_model(d, blink, v7)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    rows = [r.tolist() for r in ids]

    def ours() -> torch.Tensor:
        with torch.inference_mode():
            return model.forward(ids).output

    def theirs() -> list[torch.Tensor]:
        return [ref.forward(r, None, full_output=True)[0] for r in rows]

    diff = max((a - b).abs().max().item() for a, b in zip(ours(), theirs()))
    t_ours, t_ref = _time_pair(ours, theirs, reps)
    return {"mi_rwkv_s": t_ours, "rwkv_pkg_s": t_ref, "speedup": t_ref / t_ours,
            "tokens_per_s": BATCH * SEQ / t_ours, "max_abs_logit_diff": diff}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", choices=["6", "7", "both"], default="both")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    versions = [6, 7] if args.version == "both" else [int(args.version)]
    print(f"{LAYERS} layers x {HIDDEN} hidden, vocab {VOCAB}, {BATCH}x{SEQ} tokens, F32, "
          f"torch threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        for v in versions:
            r = bench(v, args.reps, Path(tmp))
            print(f"RWKV-{v}: mi-rwkv {r['mi_rwkv_s']:.3f} s ({r['tokens_per_s']:.0f} tok/s), "
                  f"rwkv package {r['rwkv_pkg_s']:.3f} s, speedup x{r['speedup']:.2f}, "
                  f"max |logit diff| {r['max_abs_logit_diff']:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
