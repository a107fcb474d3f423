"""RWKV state knockout: how much does each layer's memory of one token matter?

No trained RWKV is needed (or downloaded): the example writes a tiny random RWKV-7
checkpoint in the flash-linear-attention format to a temporary directory, loads it with
`mi.MIModel.from_pretrained`, and for every layer skips the key-value write of one
token into that layer's recurrent state (`StateKnockoutSpec(...).layer(i)`), printing the
KL divergence of the final next-token distribution from the unmodified run. Random
weights give arbitrary numbers; the workflow is the same on a real checkpoint.

    .venv/bin/python examples/rwkv_state_knockout.py [--layers 4] [--position 2]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

# Load only the RWKV plugin (the others are not needed here and cost import time).
os.environ.setdefault("MI_CORE_PLUGINS", "rwkv")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import mi_core as mi  # noqa: E402
from mi_rwkv import run_state_knockout  # noqa: E402


def write_tiny_rwkv7(directory: Path, layers: int, hidden: int = 128, head: int = 64,
                     vocab: int = 256, seed: int = 0) -> Path:
    """Random RWKV-7 weights (fla names) + config.json; decays in (0.55, 1)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    c, inter = hidden, 4 * hidden
    w = {"model.embeddings.weight": rnd(vocab, c), "lm_head.weight": rnd(vocab, c, scale=c ** -0.5)}
    for n in ("model.layers.0.pre_norm", "model.norm"):
        w[n + ".weight"], w[n + ".bias"] = 1 + rnd(c, scale=0.1), rnd(c, scale=0.1)
    for i in range(layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.attn."
        for n in ("attn_norm", "ffn_norm"):
            w[p + n + ".weight"], w[p + n + ".bias"] = 1 + rnd(c, scale=0.1), rnd(c, scale=0.1)
        for n in "rwkvag":
            w[a + f"x_{n}"] = torch.rand(1, 1, c, generator=g)
        w[a + "k_k"], w[a + "k_a"] = 0.5 + 0.5 * torch.rand(c, generator=g), torch.rand(c, generator=g)
        w[a + "r_k"] = rnd(c // head, head, scale=0.5)
        for n in "rkvo":
            w[a + f"{n}_proj.weight"] = rnd(c, c, scale=c ** -0.5)
        for n, r in (("w", 32), ("a", 32), ("g", 64)) + ((("v", 16),) if i else ()):
            w[a + f"{n}_lora.lora.0.weight"] = rnd(r, c, scale=c ** -0.5)
            w[a + f"{n}_lora.lora.2.weight"] = rnd(c, r, scale=r ** -0.5)
            if n != "g":
                w[a + f"{n}_lora.lora.2.bias"] = rnd(c)
        w[a + "g_norm.weight"], w[a + "g_norm.bias"] = 1 + rnd(c, scale=0.1), rnd(c, scale=0.1)
        w[p + "ffn.x_k"] = torch.rand(c, generator=g)
        w[p + "ffn.key.weight"], w[p + "ffn.value.weight"] = rnd(inter, c, scale=c ** -0.5), rnd(c, inter, scale=inter ** -0.5)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in w.items()}, str(directory / "model.safetensors"))
    cfg = {"model_type": "rwkv7", "vocab_size": vocab, "hidden_size": c, "num_hidden_layers": layers,
           "head_dim": head, "intermediate_size": inter, "norm_eps": 1e-5}
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


def main() -> int:
    ap = argparse.ArgumentParser(description="RWKV state knockout, KL per layer")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--position", type=int, default=2, help="token whose state write is skipped")
    ap.add_argument("--seq", type=int, default=12)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = mi.MIModel.from_pretrained(write_tiny_rwkv7(Path(tmp) / "tiny-rwkv7", args.layers))
        ids = torch.randint(0, model.vocab_size, (1, args.seq), generator=torch.Generator().manual_seed(1))
        baseline = model.forward(ids).output.float()
        print(f"{model}: knocking out position {args.position} of {args.seq}")
        print("layer  KL(baseline || knockout) at the last position [nats]")
        for layer in range(model.num_layers):
            spec = mi.StateKnockoutSpec(positions=[args.position]).layer(layer)
            res = run_state_knockout(model, ids, spec, baseline=baseline)
            print(f"{layer:5d}  {res.kl_divergence():.6f}")
        every = run_state_knockout(model, ids, mi.StateKnockoutSpec(positions=[args.position]), baseline)
        print(f"  all  {every.kl_divergence():.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
