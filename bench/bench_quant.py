"""Dequantization at load: mi-transformer's FP8 and MXFP4 against transformers' own, side by
side, on one weight of a real size.

FP8: a 5120 x 25600 e4m3 weight (Qwen3-32B-FP8's MLP width) with 128 x 128 block scales;
transformers' ``Fp8Dequantize._dequantize_one`` (what it runs on CPU) vs
``mi_transformer.quant.dequantize_fp8``, both to F32. MXFP4: one gpt-oss-20b expert stack,
``gate_up_proj`` [32 experts, 5760 rows, 90 groups, 16 bytes]; transformers'
``convert_moe_packed_tensors`` vs ``dequantize_mxfp4`` (+ the transpose to its layout).
Random data, CPU, medians of `--reps` round-robin runs; prints a markdown table with the
ratio ours / transformers and the throughput in dequantized GB/s (F32 out).

    .venv/bin/python bench/bench_quant.py [--reps 5] [--threads N]
"""

from __future__ import annotations

import argparse

import torch

from _timing import round_robin  # bench/ is on sys.path when run as a script


def _fp8_case() -> dict[str, object]:
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    from mi_transformer.quant import dequantize_fp8

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(5120, 25600, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(40, 200, generator=g) + 0.5
    ref = Fp8Dequantize(None)
    return {"transformers": lambda: ref._dequantize_one(w, s, output_dtype=torch.float32),
            "ours": lambda: dequantize_fp8(w, s, (128, 128)),
            "_bytes": w.numel() * 4}


def _mxfp4_case() -> dict[str, object]:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from mi_transformer.quant import dequantize_mxfp4

    g = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (32, 5760, 90, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(118, 130, (32, 5760, 90), generator=g, dtype=torch.uint8)
    return {"transformers": lambda: convert_moe_packed_tensors(blocks, scales,
                                                               dtype=torch.float32),
            "ours": lambda: dequantize_mxfp4(blocks, scales).transpose(1, 2).contiguous(),
            "_bytes": blocks.numel() * 2 * 4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.reps} reps\n")
    print("| case | transformers (s) | ours (s) | ours / transformers | ours GB/s (F32 out) |")
    print("|---|---|---|---|---|")
    for name, make in (("FP8 5120 x 25600, blocks 128", _fp8_case),
                       ("MXFP4 gpt-oss-20b gate_up_proj (one layer)", _mxfp4_case)):
        case = make()
        size = case.pop("_bytes")
        t = round_robin(case, args.reps)  # type: ignore[arg-type]
        print(f"| {name} | {t['transformers']:.3f} | {t['ours']:.3f} | "
              f"{t['ours'] / t['transformers']:.2f} | {size / t['ours'] / 1e9:.2f} |")


if __name__ == "__main__":
    main()
