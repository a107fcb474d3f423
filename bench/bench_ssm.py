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
3072; Falcon-H1: attention beside such a Mamba-2 in every layer, head_dim 64,
Falcon-H1-0.5B's mixer settings and multipliers; LFM2: short convolutions (window 3) with
attention on every third layer, SwiGLU of 2048; LFM2-MoE: the same with 8 experts of 512 top-2 after a dense
first layer). The gated DeltaNet hybrids: d_model 1024,
vocab 8000 (small files on a shared disk),
gated DeltaNet 8 key / 16 value heads x 128 (Qwen3-Next's head sizes), conv 4, attention
every 4th layer (8 heads x 128, 2 KV heads, output gate, rotary 0.25 for the Qwen ones);
Qwen3-Next's and Qwen3.5-MoE's MoE 16 experts top 4 x 256 plus a 256 shared expert, the dense
MLPs 2816.
Zamba2 (d_model 768): Mamba-2 24 heads x 64 (d_state 64, 1 group, chunk 256) on every layer,
the shared block (12 heads x 128 on 1536 channels, RoPE, MLP 3072, two weight sets, LoRA rank
128 on q / k / v and the MLP) on layers 2 and 5 (and every 3rd after). MiniMax (d_model 768):
lightning attention 12 heads x 64, attention (4 KV heads) on the last of every 4 layers, MoE
on every layer: 8 experts of 1024 top-2 (`minimax`), or one expert of 2048 (`minimax_1e`, the
mixers without the MoE cost).
Built with
transformers, saved as safetensors, loaded by us from that directory. CPU, batch 2 x
`--seq` random ids. Each row: the median of `--reps` runs taken round-robin, our empty-hook
forward and transformers' forward (``use_cache=False``), their ratio, and the max logit
difference. Target: ours <= 1.05x transformers.

    .venv/bin/python bench/bench_ssm.py [--reps 5] [--threads N] [--seq 256] [--layers 6]
        [--dtype float32|bfloat16] [--timer wall|cpu]
        [--only mamba,falcon_mamba,mamba2,jamba,bamba,...,lfm2]

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
            "nemotron_h", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "olmo_hybrid",
            "zamba2", "minimax", "minimax_1e", "falcon_h1", "lfm2", "lfm2_moe")
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
    # Falcon-H1: attention beside Mamba-2 in every layer (0.5B's mixer: no gated norm,
    # mamba_d_ssm 24 x 64, its multipliers); LFM2: conv, conv, attention, ... (window 3)
    "falcon_h1": dict(intermediate_size=2048, head_dim=64, mamba_d_ssm=1536,
                      mamba_rms_norm=False, embedding_multiplier=5.66, key_multiplier=0.39,
                      attention_out_multiplier=0.94, ssm_in_multiplier=1.25,
                      ssm_out_multiplier=0.24, ssm_multipliers=[0.35, 0.25, 0.35, 0.5, 0.35],
                      mlp_multipliers=[0.88, 0.59], lm_head_multiplier=0.04, **_M2, **_ATTN),
    "lfm2": dict(intermediate_size=3072, block_multiple_of=256, conv_L_cache=3, **_ATTN),
    "lfm2_moe": dict(intermediate_size=2048, moe_intermediate_size=512, num_experts=8,
                     num_experts_per_tok=2, num_dense_layers=1, conv_L_cache=3, **_ATTN),
}
#: Zamba2 and MiniMax (issue 23, part 2): model_type, config kwargs besides the common ones
#: (the schedules are made per layer count in _hf)
ZM: dict[str, tuple[str, dict[str, Any]]] = {
    "zamba2": ("zamba2", dict(num_attention_heads=12, n_mamba_heads=24, mamba_ngroups=1,
                              mamba_d_state=64, chunk_size=256, num_mem_blocks=2,
                              use_shared_attention_adapter=True, adapter_rank=128,
                              use_mem_rope=True)),
    "minimax": ("minimax", dict(num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                                intermediate_size=1024, num_local_experts=8,
                                num_experts_per_tok=2, block_size=256)),
    "minimax_1e": ("minimax", dict(num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                                   intermediate_size=2048, num_local_experts=1,
                                   num_experts_per_tok=1, block_size=256)),
}
_LINEAR = dict(hidden_size=1024, vocab_size=8000, num_attention_heads=8, num_key_value_heads=2,
               head_dim=128, intermediate_size=2816, linear_num_key_heads=8,
               linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
               linear_conv_kernel_dim=4)


def _hf(kind: str, layers: int, dtype: torch.dtype) -> Any:
    import transformers as tf

    common = dict(hidden_size=768, num_hidden_layers=layers, vocab_size=50280)
    if kind in ZM:
        model_type, extra = ZM[kind]
        extra = dict(extra)
        if model_type == "zamba2":
            extra["layers_block_type"] = ["hybrid" if i % 3 == 2 else "linear_attention"
                                          for i in range(layers)]
        else:
            extra["layer_types"] = ["full_attention" if i % 4 == 3 else "linear_attention"
                                    for i in range(layers)]
        cfg = tf.AutoConfig.for_model(model_type, **common, **extra)
    elif kind in HYBRIDS:
        extra = dict(HYBRIDS[kind])
        if kind == "granitemoehybrid":
            extra["layer_types"] = ["attention" if i == 2 else "mamba" for i in range(layers)]
        if kind == "nemotron_h":
            del common["num_hidden_layers"]  # the pattern says how many
        if kind in ("lfm2", "lfm2_moe"):  # attention on every third layer (LFM2-350M's)
            extra["layer_types"] = ["full_attention" if i % 3 == 2 else "conv"
                                    for i in range(layers)]
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
