"""The checkpoints the TransformerLens demo ports run on, and TransformerLens' models of them.

- SmolLM2-135M-Instruct (the embedded GGUF saved as an HF directory, tests.support.smollm2_hf);
- SmolLM2 cut to its first layers (the patching demos, whose library calls loop over every
  layer, head and position: the same trained weights, fewer layers);
- a GPT-2-shaped tiny model (2 layers, learned positions, LayerNorm with biases, random
  weights) with SmolLM2's tokenizer, for the cells that need GPT-2's architecture or stood for
  another small model (distilgpt2, attn-only-2l, gpt2-xl).

TransformerLens' side is built with its own conversion and processing (tests.support.tl_hooked)
and its defaults (weights processed, BOS prepended, the tokenizer attached).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.smollm2_hf import smollm2_hf_dir

TL_DEFAULTS = dict(fold_ln=True, center_writing_weights=True, center_unembed=True,
                   fold_value_biases=True, default_prepend_bos=True)


def smollm2_layers(gguf: Path, n_layers: int, root: Path) -> Path:
    """SmolLM2's first `n_layers` layers (embedding, final norm and tokenizer kept)."""
    from safetensors.torch import load_file, save_file

    out = root / f"smollm2-{n_layers}l"
    if out.exists():
        return out
    src = smollm2_hf_dir(gguf)
    out.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = n_layers
    (out / "config.json").write_text(json.dumps(cfg))
    keep = {k: v for k, v in load_file(str(src / "model.safetensors")).items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < n_layers}
    save_file(keep, str(out / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    return out


def gpt2_tiny(gguf: Path, root: Path, n_layer: int = 2, n_head: int = 4,
              n_embd: int = 64) -> Path:
    """A random GPT-2 (2 layers, 4 heads, d_model 64, 256 positions; or GPT-2 small's 12 x 12
    heads at a tiny width, where a demo reads its layer and head indices) with SmolLM2's
    tokenizer and vocabulary; weights drawn larger than HF's init so heads differ."""
    from transformers import GPT2Config, GPT2LMHeadModel

    out = root / ("gpt2-tiny" if n_layer == 2 else f"gpt2-tiny-{n_layer}l")
    if out.exists():
        return out
    src = smollm2_hf_dir(gguf)
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    cfg = GPT2Config(n_embd=n_embd, n_head=n_head, n_layer=n_layer, n_positions=256,
                     n_inner=2 * n_embd, vocab_size=vocab, bos_token_id=1, eos_token_id=2)
    g = torch.Generator().manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1:
                p.add_(0.1 * noise)
            else:
                p.copy_(noise if name.startswith("transformer.w") else 0.1 * noise)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    return out


def tl_model(directory: Path):
    """TransformerLens' HookedTransformer of `directory` with its from_pretrained defaults."""
    from transformers import AutoTokenizer

    from tests.support.tl_hooked import hooked_gpt2, hooked_llama

    tok = AutoTokenizer.from_pretrained(str(directory))
    arch = json.loads((Path(directory) / "config.json").read_text())["model_type"]
    build = hooked_gpt2 if arch == "gpt2" else hooked_llama
    return build(directory, tokenizer=tok, **TL_DEFAULTS)


def reset_tl(model) -> None:
    """A shared reference model back to its state after loading (hooks, switches)."""
    model.reset_hooks(including_permanent=True)
    for flag in ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in"):
        setattr(model.cfg, flag, False)


@pytest.fixture(scope="session")
def tl_checkpoints(smollm2_gguf_path, tmp_path_factory) -> dict[str, Path]:
    """name -> checkpoint directory: "smollm2" (all 30 layers), "smollm2_2l", "smollm2_3l"
    (its first layers), "gpt2" (the GPT-2-shaped tiny model), "gpt2_12l" (GPT-2 small's 12
    layers of 12 heads, d_model 96), made once per session."""
    root = tmp_path_factory.mktemp("tl_checkpoints")
    return {"smollm2": smollm2_hf_dir(smollm2_gguf_path),
            "smollm2_2l": smollm2_layers(smollm2_gguf_path, 2, root),
            "smollm2_3l": smollm2_layers(smollm2_gguf_path, 3, root),
            "gpt2": gpt2_tiny(smollm2_gguf_path, root),
            "gpt2_12l": gpt2_tiny(smollm2_gguf_path, root, n_layer=12, n_head=12, n_embd=96)}
