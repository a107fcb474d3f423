"""Mamba, Falcon-Mamba, Mamba-2, the hybrids (Jamba, Bamba, Granite 4.0-H, Nemotron-H) and the
gated DeltaNet hybrids (Qwen3-Next, Qwen3.5, OLMo hybrid) at real widths: mi-transformer +
mi-ssm against transformers' own CPU path (its torch fallbacks: the sequential selective scan
for Mamba-1, the chunked SSD for Mamba-2, the chunked gated delta rule), same weights, same
dtype, side by side.

Random weights at the 130m checkpoints' widths (d_model 768, vocab 50280; Mamba: d_state 16,
expand 2, dt_rank 48; Mamba-2: 24 heads x 64, d_state 128, 1 group, chunk 256) with fewer
layers (`--layers`, default 6) to keep a run short on a shared machine; the hybrids at the
same width with attention on layer 2 (12 heads, 4 KV heads), Mamba-2 mixers of 24 heads x 64
(d_state 128, 1 group), MLPs of 2048 (Jamba: 8 experts top-2 on odd layers; Granite: 8
experts of 512 top-2 + a shared MLP of 1024; Nemotron-H: pattern M-M*M-, relu2 MLP of
3072). The gated DeltaNet hybrids: d_model 1024, vocab 8000 (small files on a shared disk),
gated DeltaNet 8 key / 16 value heads x 128 (Qwen3-Next's head sizes), conv 4, attention
every 4th layer (8 heads x 128, 2 KV heads, output gate, rotary 0.25 for the Qwen ones);
Qwen3-Next's and Qwen3.5-MoE's MoE 16 experts top 4 x 256 plus a 256 shared expert, the dense
MLPs 2816.
Built with
transformers, saved as safetensors, loaded by us from that directory. CPU, batch 2 x
`--seq` random ids. Each row: the median of `--reps` runs taken round-robin, our empty-hook
forward and transformers' forward (``use_cache=False``), their ratio, and the max logit
difference. Target: ours <= 1.05x transformers.

    .venv/bin/python bench/bench_ssm.py [--reps 5] [--threads N] [--seq 256] [--layers 6]
        [--dtype float32|bfloat16] [--timer wall|cpu]
        [--only mamba,falcon_mamba,mamba2,jamba,bamba,...]

``--timer cpu`` measures process CPU time (all threads), which a machine shared with other
jobs inflates far less than wall time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import mi_core as mi

from _timing import round_robin  # bench/ is on sys.path when run as a script

BATCH = 2
FAMILIES = ("mamba", "falcon_mamba", "mamba2", "jamba", "bamba", "granitemoehybrid",
            "nemotron_h", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "olmo_hybrid")
_ATTN = dict(num_attention_heads=12, num_key_value_heads=4)
_M2 = dict(mamba_n_heads=24, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128,
           mamba_chunk_size=256)
#: the hybrids' configs (AutoConfig.for_model kwargs besides the common ones)
HYBRIDS: dict[str, dict[str, Any]] = {
    "jamba": dict(intermediate_size=2048, attn_layer_period=4, attn_layer_offset=2,
                  expert_layer_period=2, expert_layer_offset=1, num_experts=8,
                  num_experts_per_tok=2, mamba_d_state=16, mamba_dt_rank=48, **_ATTN),
    "bamba": dict(intermediate_size=2048, attn_layer_indices=[2], **_M2, **_ATTN),
    "granitemoehybrid": dict(intermediate_size=512, shared_intermediate_size=1024,
                             num_local_experts=8, num_experts_per_tok=2,
                             position_embedding_type="rope", **_M2, **_ATTN),
    "nemotron_h": dict(intermediate_size=3072, hybrid_override_pattern="M-M*M-", head_dim=64,
                       mamba_num_heads=24, mamba_head_dim=64, n_groups=1, ssm_state_size=128,
                       chunk_size=256, **_ATTN),
}
_LINEAR = dict(hidden_size=1024, vocab_size=8000, num_attention_heads=8, num_key_value_heads=2,
               head_dim=128, intermediate_size=2816, linear_num_key_heads=8,
               linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
               linear_conv_kernel_dim=4)


def _hf(kind: str, layers: int, dtype: torch.dtype) -> Any:
    import transformers as tf

    common = dict(hidden_size=768, num_hidden_layers=layers, vocab_size=50280)
    if kind in HYBRIDS:
        extra = dict(HYBRIDS[kind])
        if kind == "granitemoehybrid":
            extra["layer_types"] = ["attention" if i == 2 else "mamba" for i in range(layers)]
        if kind == "nemotron_h":
            del common["num_hidden_layers"]  # the pattern says how many
        cfg = tf.AutoConfig.for_model(kind, **common, **extra)
    elif kind in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "olmo_hybrid"):
        extra: dict[str, Any] = dict(num_experts=16, num_experts_per_tok=4,
                                     moe_intermediate_size=256,
                                     shared_expert_intermediate_size=256) \
            if kind in ("qwen3_next", "qwen3_5_moe_text") else {}
        kw = dict(_LINEAR, num_hidden_layers=layers, **extra)
        if kind == "olmo_hybrid":  # as released: no rotary; key and value widths equal
            kw.pop("head_dim")
            kw.update(rope_parameters=None, linear_key_head_dim=256, pad_token_id=0)
        cfg = tf.AutoConfig.for_model(kind, **kw)
    elif kind == "mamba2":
        cfg = tf.Mamba2Config(state_size=128, num_heads=24, head_dim=64, n_groups=1,
                              expand=2, chunk_size=256, **common)
    else:
        cls = tf.MambaConfig if kind == "mamba" else tf.FalconMambaConfig
        cfg = cls(state_size=16, expand=2, time_step_rank=48, **common)
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def bench(kind: str, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    dtype = getattr(torch, args.dtype)
    hf = _hf(kind, args.layers, dtype)
    hf.save_pretrained(workdir / kind)
    model = mi.MIModel.from_pretrained(workdir / kind, dtype=dtype)
    vocab = hf.config.vocab_size
    ids = torch.randint(0, vocab, (BATCH, args.seq), generator=torch.Generator().manual_seed(0))

    def ours() -> torch.Tensor:
        with torch.inference_mode():
            return model.forward(ids).output

    def theirs() -> torch.Tensor:
        with torch.inference_mode():
            return hf(ids, use_cache=False).logits

    diff = (ours().float() - theirs().float()).abs().max().item()
    clock = time.process_time if args.timer == "cpu" else time.perf_counter
    t = round_robin({"ours": ours, "theirs": theirs}, args.reps, clock)
    return {"ours": t["ours"], "theirs": t["theirs"], "ratio": t["ours"] / t["theirs"],
            "diff": diff}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--timer", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--only", default=",".join(FAMILIES))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"d_model 768 (hybrids 1024), {args.layers} layers, {BATCH} x {args.seq} tokens, "
          f"{args.dtype}, CPU, "
          f"torch threads {torch.get_num_threads()}, timer {args.timer}, median of {args.reps}\n")
    print("| family | ours (s) | transformers (s) | ours / transformers | max logit diff |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.only.split(","):
            r = bench(kind, args, Path(tmp))
            print(f"| {kind} | {r['ours']:.3f} | {r['theirs']:.3f} | {r['ratio']:.2f}x | "
                  f"{r['diff']:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
