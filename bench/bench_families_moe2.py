"""gpt-oss, DeepSeek-V3 and Llama 4 text at reduced real shapes: mi-transformer against
transformers, side by side.

Random weights (no hub access), each model a few layers of the published width where a CPU
can run it: gpt-oss (4 layers x 1440, 16 heads of 64 / 4 KV, 8 experts of 1440, top-4,
window 128 on every other layer, sinks), DeepSeek-V3 (4 layers x 1024, 16 heads, MLA ranks
384 / 256, nope 64 / rope 32 / v 64, first layer dense, 16 experts of 256 in 4 groups, top-4,
one shared expert), Llama 4 (4 layers x 1024, 16 heads of 64 / 4 KV, chunks of 64, every
fourth layer NoPE, 8 experts of 512, top-1, a shared expert, every other layer MoE). Each is
built with transformers (eager attention for gpt-oss, which has no SDPA path; SDPA for the
others), saved and loaded by us. F32, CPU, batch 2 x 256 random ids, medians of `--reps`
round-robin. Printed as a markdown table:

- ours, empty HookSpec / transformers (target <= 1.02x for the families transformers runs
  with SDPA; gpt-oss: both materialise the scores, sinks need them)
- ours `run_with_cache` (every default point) / ours empty (what capturing everything costs)
- the KV cache of 256 tokens: bytes per token, ours / transformers (MLA: transformers caches
  the latent, we cache per-head keys and values)

    .venv/bin/python bench/bench_families_moe2.py [--reps 5] [--threads N] [--timer wall|cpu]
        [--only gpt_oss,deepseek_v3,llama4_text]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

import mi_core as mi

from _timing import round_robin  # bench/ is on sys.path when run as a script

BATCH, SEQ = 2, 256

_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt_oss": dict(hidden_size=1440, num_hidden_layers=4, num_attention_heads=16,
                    num_key_value_heads=4, head_dim=64, intermediate_size=1440,
                    num_local_experts=8, num_experts_per_tok=4, sliding_window=128,
                    vocab_size=32000, max_position_embeddings=4096),
    "deepseek_v3": dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
                        num_key_value_heads=16, intermediate_size=2048, q_lora_rank=384,
                        kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32,
                        v_head_dim=64, n_routed_experts=16, num_experts_per_tok=4,
                        moe_intermediate_size=256, n_shared_experts=1, n_group=4,
                        topk_group=2, first_k_dense_replace=1, vocab_size=32000,
                        max_position_embeddings=4096),
    "llama4_text": dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
                        num_key_value_heads=4, head_dim=64, intermediate_size=512,
                        intermediate_size_mlp=2048, num_local_experts=8,
                        num_experts_per_tok=1, interleave_moe_layer_step=2,
                        attention_chunk_size=64, vocab_size=32000,
                        max_position_embeddings=4096),
}


def _hf_model(kind: str) -> Any:
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.AutoConfig.for_model(kind, **_CONFIGS[kind])
    impl = "eager" if kind == "gpt_oss" else "sdpa"
    return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl,
                                               dtype=torch.float32).eval()


def _cache_bytes(past: Any) -> int:
    """Bytes of every tensor held by a cache object (ours: KVCache; transformers: Cache)."""
    seen, total = set(), 0
    stack = [past]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            if id(obj) not in seen:
                seen.add(id(obj))
                total += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return total


def bench(kind: str, reps: int, clock: Callable[[], float], tmp: Path) -> list[str]:
    hf = _hf_model(kind)
    d = tmp / kind
    hf.save_pretrained(d)
    ours = mi.MIModel.from_pretrained(d)
    ids = torch.randint(0, ours.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = hf(ids, use_cache=True)
    diff = (ours.forward(ids).output - out.logits).abs().max().item()
    past = ours.backend.new_past(BATCH)
    with torch.inference_mode():
        ours.backend.forward(ids, past=past)
    kv = _cache_bytes(past) / (BATCH * SEQ), _cache_bytes(out.past_key_values) / (BATCH * SEQ)
    _, cache = ours.run_with_cache(ids)
    n_points = len(cache)
    del cache, out, past

    def ours_empty() -> object:
        return ours.forward(ids, mi.HookSpec()).output

    def hf_forward() -> object:
        with torch.inference_mode():
            return hf(ids, use_cache=False).logits

    def ours_cache() -> object:
        return ours.run_with_cache(ids)

    t = round_robin({"ours": ours_empty, "hf": hf_forward, "cache": ours_cache}, reps, clock)
    impl = "eager" if kind == "gpt_oss" else "SDPA"
    rows = [f"| {kind} | ours empty HookSpec / transformers {impl} | "
            f"**{t['ours'] / t['hf']:.3f}×** ({t['ours'] * 1e3:.0f} / {t['hf'] * 1e3:.0f} ms) | "
            f"max abs logit diff {diff:.1e} |",
            f"| {kind} | ours `run_with_cache` ({n_points} points) / ours empty | "
            f"**{t['cache'] / t['ours']:.3f}×** ({t['cache'] * 1e3:.0f} ms) | |",
            f"| {kind} | KV cache bytes per token, ours / transformers | "
            f"**{kv[0] / kv[1]:.2f}×** ({kv[0] / 1024:.0f} / {kv[1] / 1024:.0f} KiB) | |"]
    del hf, ours
    gc.collect()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timer", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--only", default=",".join(_CONFIGS))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["HF_HUB_OFFLINE"] = "1"
    clock = time.process_time if args.timer == "cpu" else time.perf_counter
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, timer {args.timer}, "
          f"batch {BATCH}x{SEQ}, medians of {args.reps}", file=sys.stderr)
    print("| model | comparison | ratio | check |\n|---|---|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.only.split(","):
            for row in bench(kind, args.reps, clock, Path(tmp)):
                print(row, flush=True)


if __name__ == "__main__":
    main()
