"""Tiny checkpoints of Gemma-4 (dense and MoE) and Gemma-3n, made with `transformers`.

Each config exercises what makes the family different, with the awkward settings published
checkpoints use and values away from their defaults so that a wrong one shows: sliding and full
layers mixed (window 5, shorter than the 12..24-token prompts), the last layers sharing the
keys and values of the last earlier layer of their type, a head size and KV-head count per
layer type, proportional RoPE on the full layers (half the frequencies, low bases the prompts
reach), keys used as values, a double-wide MLP on the shared layers, per-layer inputs, the
mixture of experts beside the dense MLP, a final soft-cap; Gemma-3n: three AltUp streams
(one variant whose active stream is not the first; coefficients beyond `altup_coef_clip`,
which transformers applies only while training), Laurel, activation sparsity on two layers
(0.95 and 0.5), an MLP width per layer and a per-layer-input table smaller than the vocabulary
(ids past it read row 0). Weights unit-scale as tests/transformer/conftest.py's ``make_tiny``;
the buffers transformers leaves at one or zero (``layer_scalar``) and the AltUp output scale
are randomised too, so a wrong use shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.support.tiny_families_moe2 import build_tiny, session_cache

WINDOW = 5
_TYPES4 = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
_ROPE4 = {"sliding_attention": {"rope_type": "default", "rope_theta": 300.0},
          "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                             "rope_theta": 1000.0}}
_ROPE3N = {"sliding_attention": {"rope_type": "default", "rope_theta": 300.0},
           "full_attention": {"rope_type": "default", "rope_theta": 2000.0}}

#: name -> (model_type, config overrides on tiny_families._COMMON)
GEMMA_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # E2B / E4B style: per-layer inputs, layers 2 and 3 share layers 0 and 1's keys and values
    # (and have a double-wide MLP), full layers 32 wide with one KV head (as transformers writes
    # it: per_layer_config), proportional RoPE on half the full heads' frequencies
    "gemma4_text": ("gemma4_text", dict(
        num_hidden_layers=4, head_dim=16, global_head_dim=32, sliding_window=WINDOW,
        layer_types=_TYPES4, rope_parameters=_ROPE4, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=128, num_kv_shared_layers=2, use_double_wide_mlp=True,
        final_logit_softcapping=5.0)),
    # 26B-A4B style: keys as values on the full layers with one KV head
    # (num_global_key_value_heads), a mixture of experts beside every dense MLP, no per-layer
    # inputs, no shared KV
    "gemma4_moe": ("gemma4_text", dict(
        num_hidden_layers=3, head_dim=16, global_head_dim=24, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "full_attention"],
        rope_parameters=_ROPE4, hidden_size_per_layer_input=0, attention_k_eq_v=True,
        num_global_key_value_heads=1, enable_moe_block=True, num_experts=4, top_k_experts=2,
        moe_intermediate_size=24, final_logit_softcapping=5.0)),
    # E4B style: 3 AltUp streams, Laurel, sparsity on layers 0 and 1, widths per layer,
    # layers 2 and 3 share KV, a per-layer table of 100 ids (the vocabulary has 128)
    "gemma3n_text": ("gemma3n_text", dict(
        num_hidden_layers=4, head_dim=16, intermediate_size=[96, 96, 128, 128],
        sliding_window=WINDOW, layer_types=_TYPES4, rope_parameters=_ROPE3N,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=100, num_kv_shared_layers=2,
        laurel_rank=4, altup_num_inputs=3, activation_sparsity_pattern=[0.95, 0.5, 0.0, 0.0],
        final_logit_softcapping=5.0, altup_coef_clip=0.05)),
    # the active stream second (its per-layer-input branch then lands on it, as transformers)
    "gemma3n_active1": ("gemma3n_text", dict(
        num_hidden_layers=3, head_dim=16, intermediate_size=96, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "full_attention"],
        rope_parameters=_ROPE3N, hidden_size_per_layer_input=8, vocab_size_per_layer_input=128,
        num_kv_shared_layers=1, laurel_rank=4, altup_num_inputs=2, altup_active_idx=1,
        altup_correct_scale=False, activation_sparsity_pattern=[0.0, 0.9, 0.0],
        final_logit_softcapping=8.0)),
}


def randomise_buffers(model: torch.nn.Module, seed: int) -> None:
    """Weights transformers leaves at one / zero: ``layer_scalar`` (a checkpoint buffer),
    AltUp's ``correct_output_scale``: random, so a wrong use shows."""
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
        for name, p in model.named_parameters():
            if name.endswith("correct_output_scale"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))


def make_gemma(root: Path, name: str, seed: int = 0) -> Any:
    """The tiny checkpoint `name` of :data:`GEMMA_FAMILIES`, saved under `root`; a
    tests.transformer.conftest.Tiny."""
    return build_tiny(GEMMA_FAMILIES, randomise_buffers, root, name, seed)


cached_gemma = session_cache(make_gemma, "gemma")
