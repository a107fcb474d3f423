"""GPT-2, Pythia and a mixture-of-experts model at real shapes: mi-transformer against
transformers and TransformerLens, side by side.

Random weights at the real sizes (no hub access): GPT-2 small (12 layers x 768, vocab 50257),
Pythia-160m (12 x 768, parallel residual, rotary on 25% of each head, vocab 50304) and a
Mixtral-style MoE (4 layers x 512, 8 experts of 1024, top-2, vocab 32000). Each model is
built with transformers, saved as safetensors and loaded by us from that directory; the
HookedTransformer is built from the same HF model object with TransformerLens' own weight
conversion (``convert_gpt2_weights`` / ``convert_neox_weights``, no processing), as
``HookedTransformer.from_pretrained`` cannot run offline. F32, CPU, batch 4 x 128 random ids.
Timings are medians of `--reps` runs taken round-robin (A B C, A B C, ...). Printed as a
markdown table:

- ours, empty HookSpec / transformers (SDPA attention)                 target <= 1.02x
- ours `run_with_cache` (every default point) / TransformerLens `run_with_cache`   (aim < 1)
- MoE: ours, empty HookSpec / transformers (its own expert loop)
- GLM-4.5-style MoE (4 x 512, 16 experts in 4 groups, top-4, shared expert) and Hunyuan-style
  dense (12 x 768, q/k norms after RoPE): ours, empty HookSpec / transformers (--only
  glm45,hunyuan; not in the default set)

    .venv/bin/python bench/bench_families.py [--reps 5] [--threads N] [--timer wall|cpu]
        [--only gpt2,pythia,moe,glm45,hunyuan]
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

BATCH, SEQ = 4, 128


def _hf_model(kind: str) -> Any:
    import transformers as tf

    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257)
    elif kind == "pythia":
        cfg = tf.GPTNeoXConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                               intermediate_size=3072, vocab_size=50304, rotary_pct=0.25,
                               max_position_embeddings=2048, use_parallel_residual=True,
                               tie_word_embeddings=False)
    elif kind == "glm45":  # GLM-4.5-style MoE: sigmoid router, bias, groups, shared expert
        cfg = tf.Glm4MoeConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                               num_key_value_heads=4, head_dim=64, intermediate_size=1024,
                               vocab_size=32000, n_routed_experts=16, num_experts_per_tok=4,
                               n_group=4, topk_group=2, moe_intermediate_size=256,
                               routed_scaling_factor=2.5, first_k_dense_replace=1,
                               use_qk_norm=True, attention_bias=True)
    elif kind == "hunyuan":  # q/k norms after RoPE, NTK-alpha RoPE
        cfg = tf.HunYuanDenseV1Config(hidden_size=768, num_hidden_layers=12,
                                      num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                                      intermediate_size=3072, vocab_size=32000,
                                      rope_parameters={"rope_type": "dynamic", "alpha": 1000.0,
                                                       "rope_theta": 10000.0, "factor": 1.0})
    else:
        cfg = tf.MixtralConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                               num_key_value_heads=4, intermediate_size=1024, vocab_size=32000,
                               num_local_experts=8, num_experts_per_tok=2,
                               max_position_embeddings=4096)
    return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                               dtype=torch.float32).eval()


def _hooked(kind: str, hf: Any) -> Any:
    """HookedTransformer with the HF model's weights, TransformerLens' own conversion."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    c = hf.config
    if kind == "gpt2":
        from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

        cfg = HookedTransformerConfig(
            d_model=c.n_embd, d_head=c.n_embd // c.n_head, n_heads=c.n_head, d_mlp=4 * c.n_embd,
            n_layers=c.n_layer, n_ctx=c.n_positions, eps=c.layer_norm_epsilon,
            d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN",
            positional_embedding_type="standard", original_architecture="GPT2LMHeadModel",
            dtype=torch.float32, device="cpu", default_prepend_bos=False)
        convert = convert_gpt2_weights
    else:
        from transformer_lens.pretrained.weight_conversions.neox import convert_neox_weights

        d_head = c.hidden_size // c.num_attention_heads
        cfg = HookedTransformerConfig(
            d_model=c.hidden_size, d_head=d_head, n_heads=c.num_attention_heads,
            d_mlp=c.intermediate_size, n_layers=c.num_hidden_layers,
            n_ctx=c.max_position_embeddings, eps=c.layer_norm_eps, d_vocab=c.vocab_size,
            act_fn="gelu", normalization_type="LN", positional_embedding_type="rotary",
            rotary_dim=int(d_head * 0.25), rotary_base=10000, rotary_adjacent_pairs=False,
            parallel_attn_mlp=True, original_architecture="GPTNeoXForCausalLM",
            dtype=torch.float32, device="cpu", default_prepend_bos=False)
        convert = convert_neox_weights
    model = HookedTransformer(cfg, move_to_device=False)
    model.load_and_process_state_dict(convert(hf, cfg), fold_ln=False,
                                      center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False)
    return model.eval()


def bench(kind: str, reps: int, clock: Callable[[], float], tmp: Path) -> list[str]:
    hf = _hf_model(kind)
    d = tmp / kind
    hf.save_pretrained(d)
    ours = mi.MIModel.from_pretrained(d)
    ids = torch.randint(0, ours.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = hf(ids, use_cache=False).logits
    diff = (ours.forward(ids).output - ref).abs().max().item()

    def ours_empty() -> object:
        return ours.forward(ids, mi.HookSpec()).output

    def hf_sdpa() -> object:
        with torch.inference_mode():
            return hf(ids, use_cache=False).logits

    fns: dict[str, Callable[[], object]] = {"ours": ours_empty, "hf": hf_sdpa}
    rows = []
    if kind in ("gpt2", "pythia"):  # TransformerLens has the others not
        tl = _hooked(kind, hf)
        with torch.inference_mode():
            tl_diff = (tl(ids) - ref).abs().max().item()
        _, cache = ours.run_with_cache(ids)
        n_ours = len(cache)
        del cache

        def ours_cache() -> object:
            return ours.run_with_cache(ids)

        def tl_cache() -> object:
            with torch.inference_mode():
                return tl.run_with_cache(ids)

        fns.update(ours_cache=ours_cache, tl_cache=tl_cache)
    t = round_robin(fns, reps, clock)
    label = {"gpt2": "GPT-2 small", "pythia": "Pythia-160m", "moe": "Mixtral-style MoE",
             "glm45": "GLM-4.5-style MoE", "hunyuan": "Hunyuan-style dense"}[kind]
    rows.append(f"| {label} | ours empty HookSpec / transformers SDPA | "
                f"**{t['ours'] / t['hf']:.3f}×** ({t['ours'] * 1e3:.0f} / {t['hf'] * 1e3:.0f} ms) "
                f"| max abs logit diff {diff:.1e} |")
    if kind in ("gpt2", "pythia"):
        rows.append(f"| {label} | ours `run_with_cache` ({n_ours} points) / HookedTransformer "
                    f"`run_with_cache` | **{t['ours_cache'] / t['tl_cache']:.3f}×** "
                    f"({t['ours_cache'] * 1e3:.0f} / {t['tl_cache'] * 1e3:.0f} ms) | TL logit "
                    f"diff {tl_diff:.1e} |")
    del hf, ours, fns
    gc.collect()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timer", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--only", default="gpt2,pythia,moe")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["HF_HUB_OFFLINE"] = "1"
    clock = time.process_time if args.timer == "cpu" else time.perf_counter
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, timer {args.timer}, "
          f"batch {BATCH}x{SEQ}, medians of {args.reps}", file=sys.stderr)
    print("| model | comparison | ratio | check |\n|---|---|---:|---|")
    with tempfile.TemporaryDirectory(prefix="bench-families-") as tmp:
        for kind in args.only.split(","):
            for row in bench(kind, args.reps, clock, Path(tmp)):
                print(row, flush=True)


if __name__ == "__main__":
    main()
