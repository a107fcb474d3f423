"""A toy checkpoint served by the example third-party plugin (tests/example_plugin), and its
independent reference forward."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

VOCAB, D, LAYERS = 11, 8, 3


#: The words of the toy's optional tokenizer (one token each, ids in this order).
WORDS = ["<unk>", "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]


def write_toy_checkpoint(directory: Path, seed: int = 0, tokenizer: bool = False
                         ) -> dict[str, torch.Tensor]:
    """A toy-mlp checkpoint; with `tokenizer`, a word-level tokenizer.json over WORDS."""
    g = torch.Generator().manual_seed(seed)
    weights = {"embed": torch.randn(VOCAB, D, generator=g),
               "unembed": torch.randn(D, VOCAB, generator=g)}
    for i in range(LAYERS):
        weights[f"layers.{i}.w"] = torch.randn(D, D, generator=g) / D**0.5
    directory.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(
        {"model_type": "toy-mlp", "vocab_size": VOCAB, "d_model": D, "n_layers": LAYERS}))
    if tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.save(str(directory / "tokenizer.json"))
    return weights


def toy_reference(weights: dict[str, torch.Tensor], ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The toy model's forward written out independently of the backend (the reference)."""
    out = {}
    x = weights["embed"][ids]
    out["hook_embed"] = x
    for i in range(LAYERS):
        out[f"blocks.{i}.hook_resid_pre"] = x
        h = torch.tanh(x @ weights[f"layers.{i}.w"])
        out[f"blocks.{i}.hook_mlp_out"] = h
        x = x + h
        out[f"blocks.{i}.hook_resid_post"] = x
    n = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    out["logits"] = n @ weights["unembed"]
    return out
