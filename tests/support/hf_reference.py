"""Reference logits from a transformers model with a PyTorch forward hook on one module, and
the tiny random LLaMA the SAE end-to-end tests hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch


def assert_matches_hf_with_hook(ours: torch.Tensor, hf: Any, ids: torch.Tensor,
                                module: torch.nn.Module, hook: Callable[..., Any],
                                atol: float = 1e-4) -> None:
    """`ours` [batch, pos, vocab] equals `hf(ids).logits` with `hook` registered as a forward
    hook on `module` (max abs diff < `atol`, rtol 0). The hook must move the logits
    (> 1e-3), or the comparison would prove nothing."""
    handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            ref = hf(ids).logits
    finally:
        handle.remove()
    with torch.no_grad():
        clean = hf(ids).logits
    assert (ref - clean).abs().max() > 1e-3
    torch.testing.assert_close(ours, ref, atol=atol, rtol=0)


def save_tiny_hf_llama(path: Path, mlp_norm_gain: tuple[float, float] | None = None) -> Any:
    """A tiny random transformers LLaMA (vocab 64, 2 layers x 32, 4 heads, 2 KV heads, seed
    0), eval mode, saved to `path`; returned. `mlp_norm_gain` (low, high): the gains of every
    post-attention RMSNorm drawn uniformly from that range (far from 1, so that a hook read
    before the gain and one read after it differ)."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    if mlp_norm_gain is not None:
        with torch.no_grad():
            for layer in hf.model.layers:
                layer.post_attention_layernorm.weight.uniform_(*mlp_norm_gain)
    hf.save_pretrained(path)
    return hf
