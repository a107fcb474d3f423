"""Induction heads on a GPT-2 checkpoint, found by the same detector as induction_heads.py.

Real GPT-2 weights are not available offline, so this writes a small GPT-2-shaped checkpoint
(config.json + model.safetensors in GPT-2's own layout: Conv1D [in, out] weights, a fused
c_attn, learned positions) and loads it through the GPT-2 path like any hub checkpoint. Its
weights are random except for a hand-built two-layer induction circuit, so the detector has
something to find:

- layer 0, head 0 is a *previous-token* head: its query and key read the position embedding
  and match position i with i - 1; it copies the previous token into a spare subspace;
- layer 1, head 0 is an *induction* head: its query reads the current token, its key the
  previous-token subspace, so position i attends to j where token[j - 1] == token[i], and it
  copies token[j] into the logits (in-context copying).

    python examples/induction_heads_gpt2.py [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

import mi_core as mi
from mi_core.interp import detect_heads, repeated_random_tokens

VOCAB = N_POS = 128
D_TOK = D_POS = 128  # token / position / previous-token subspaces of the residual stream
D_MODEL, N_HEAD = 3 * 128, 3  # d_head = 128
TOK, POS, PREV = slice(0, 128), slice(128, 256), slice(256, 384)


def _orthogonal(n: int, g: torch.Generator) -> torch.Tensor:
    """n orthogonal rows of norm sqrt(n) (so their entries are O(1), like LayerNorm output)."""
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g))
    return q * n ** 0.5


def write_gpt2_checkpoint(directory: Path, seed: int = 0) -> Path:
    """A 2-layer GPT-2 with the induction circuit above; other heads and the MLPs are small
    random noise. Returns `directory` (config.json + model.safetensors)."""
    g = torch.Generator().manual_seed(seed)
    d, hd, L = D_MODEL, D_MODEL // N_HEAD, 2
    tok, pos = _orthogonal(D_TOK, g), _orthogonal(D_POS, g)
    wte = torch.zeros(VOCAB, d)
    wte[:, TOK] = tok
    wpe = torch.zeros(N_POS, d)
    wpe[:, POS] = pos
    # TransformerLens layout per layer: W_Q/W_K/W_V [heads, d_model, d_head], W_O [heads, d_head, d_model]
    W = {k: 0.02 * torch.randn(L, N_HEAD, d, hd, generator=g) for k in ("Q", "K", "V")}
    W_O = 0.02 * torch.randn(L, N_HEAD, hd, d, generator=g)
    shift = (pos[1:].T @ pos[:-1]) / D_POS  # maps pos[j] -> pos[j + 1]
    sharp = 6.0  # LayerNorm leaves the O(1) entries as they are; this sharpens the softmax
    W["Q"][0, 0] = 0
    W["Q"][0, 0][POS] = sharp * torch.eye(D_POS)  # query: position i
    W["K"][0, 0] = 0
    W["K"][0, 0][POS] = shift.T  # key: position j + 1, so q_i . k_j is large iff j = i - 1
    W["V"][0, 0] = 0
    W["V"][0, 0][TOK] = torch.eye(D_TOK)  # value: token j
    W_O[0, 0] = 0
    W_O[0, 0][:, PREV] = torch.eye(D_TOK)  # written to the previous-token subspace
    W["Q"][1, 0] = 0
    W["Q"][1, 0][TOK] = sharp * torch.eye(D_TOK)  # query: token i
    W["K"][1, 0] = 0
    W["K"][1, 0][PREV] = torch.eye(D_TOK)  # key: token j - 1 (from layer 0's head)
    W["V"][1, 0] = 0
    W["V"][1, 0][TOK] = torch.eye(D_TOK)  # value: token j, the one after the match
    W_O[1, 0] = 0
    W_O[1, 0][:, TOK] = 4 * torch.eye(D_TOK)  # copied into the token subspace -> the logits
    tensors: dict[str, torch.Tensor] = {"transformer.wte.weight": wte,
                                        "transformer.wpe.weight": wpe,
                                        # a small final gain keeps the tied logits O(1)
                                        "transformer.ln_f.weight": torch.full((d,), 0.05),
                                        "transformer.ln_f.bias": torch.zeros(d)}
    for i in range(L):
        p = f"transformer.h.{i}."
        # GPT-2's Conv1D stores [in, out]; c_attn's columns are [q | k | v], each head-major
        qkv = [W[k][i].permute(1, 0, 2).reshape(d, d) for k in ("Q", "K", "V")]
        tensors.update({
            p + "ln_1.weight": torch.ones(d), p + "ln_1.bias": torch.zeros(d),
            p + "ln_2.weight": torch.ones(d), p + "ln_2.bias": torch.zeros(d),
            p + "attn.c_attn.weight": torch.cat(qkv, 1), p + "attn.c_attn.bias": torch.zeros(3 * d),
            p + "attn.c_proj.weight": W_O[i].reshape(d, d), p + "attn.c_proj.bias": torch.zeros(d),
            p + "mlp.c_fc.weight": 0.02 * torch.randn(d, 4 * d, generator=g),
            p + "mlp.c_fc.bias": torch.zeros(4 * d),
            p + "mlp.c_proj.weight": 0.02 * torch.randn(4 * d, d, generator=g),
            p + "mlp.c_proj.bias": torch.zeros(d)})
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors")
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": VOCAB,
              "n_embd": d, "n_head": N_HEAD, "n_layer": L, "n_positions": N_POS,
              "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "tie_word_embeddings": True}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def main(out_dir: str | None = None) -> dict:
    directory = Path(out_dir or tempfile.mkdtemp(prefix="gpt2_induction_"))
    model = mi.MIModel.from_pretrained(write_gpt2_checkpoint(directory))
    print(f"loaded {directory} as {model.backend!r}")
    ids = repeated_random_tokens(model, length=20, batch=4, seed=0)
    r = detect_heads(model, ids)
    for kind in ("induction", "previous_token", "duplicate_token"):
        print(f"{kind:>15}: " + ", ".join(f"L{l}H{h} {s:.2f}" for l, h, s in r.top(kind, 3)))
    logp = torch.log_softmax(model.forward(ids).output.float(), -1)
    tok_lp = logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    half = (ids.shape[1] - 1) // 2
    first, second = float(-tok_lp[:, :half].mean()), float(-tok_lp[:, half:].mean())
    print(f"loss on the first copy {first:.2f}, on the repeat {second:.2f} nats/token")
    return {"top": r.top("induction", 3), "previous": r.top("previous_token", 3),
            "loss_first": first, "loss_second": second}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
