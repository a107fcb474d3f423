"""Tiny random hybrid checkpoints made with `transformers` (state-space mixers + attention).

The same unit-scale recipe as tests/support/ssm_tiny.py (embeddings N(0, 1), matrices
N(0, 1 / fan_in), norm gains 1 + 0.1 N(0, 1), A_log / D / dt biases around transformers'
initialisation), with the schedules real checkpoints use, shrunk: Jamba's attention every
few layers (period 4, offset 2, as Jamba-v0.1's 8 / 4) and its experts every other layer
(offset 0 here so that both a Mamba and an attention layer carry a mixture of experts),
grouped-query attention, top-2 of 4 experts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.ssm_tiny import VOCAB, TinySsm, _randomise

#: name -> (model_type, config)
HYBRID_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "jamba": ("jamba", dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            attn_layer_period=4, attn_layer_offset=2, expert_layer_period=2,
                            expert_layer_offset=0, num_experts=4, num_experts_per_tok=2,
                            mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
                            pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Bamba-9B: 128 heads in 1 group, attention on 3 of 32 layers; here 8 heads in 2 groups,
    # a chunk (8) shorter than the prompts
    "bamba": ("bamba", dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                            attn_layer_indices=[1], mamba_n_heads=8, mamba_n_groups=2,
                            mamba_d_state=8, mamba_chunk_size=8, pad_token_id=0,
                            bos_token_id=1, eos_token_id=2)),
    # Granite 4.0-H: multipliers != 1, MoE + shared MLP, RoPE on ("rope"); the dense variant
    # (no experts: the shared MLP alone) without positions, as Granite-4.0-H-Micro
    "granitemoehybrid": ("granitemoehybrid", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=24, shared_intermediate_size=40,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["mamba", "attention", "mamba"], position_embedding_type="rope",
        num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=8, mamba_n_groups=2,
        mamba_d_state=8, mamba_chunk_size=8, embedding_multiplier=1.5,
        residual_multiplier=0.7, attention_multiplier=0.3, logits_scaling=2.0, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)),
    "granitemoehybrid_dense": ("granitemoehybrid", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=24, shared_intermediate_size=40,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["attention", "mamba"], position_embedding_type="nope",
        num_local_experts=0, mamba_n_heads=8, mamba_n_groups=1, mamba_d_state=8,
        mamba_chunk_size=8, residual_multiplier=0.5, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # Nemotron-H: Mamba-2 (8 heads, 2 groups; heads x head_dim != expand x hidden, as in
    # Nemotron-Nano-9B-v2), an MLP-only layer, attention with an explicit head_dim, legacy
    # hybrid_override_pattern (transformers 5 saves layers_block_type)
    "nemotron_h": ("nemotron_h", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, hybrid_override_pattern="M-*M",
        num_attention_heads=4, num_key_value_heads=2, head_dim=12, mamba_num_heads=8,
        mamba_head_dim=6, n_groups=2, ssm_state_size=8, chunk_size=8, expand=2,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}

#: name -> each layer's type as model.layer_types says it
HYBRID_LAYER_TYPES: dict[str, list[str]] = {
    "jamba": ["mamba", "mamba", "full_attention", "mamba"],
    "bamba": ["mamba2", "full_attention", "mamba2"],
    "granitemoehybrid": ["mamba2", "full_attention", "mamba2"],
    "granitemoehybrid_dense": ["full_attention", "mamba2"],
    "nemotron_h": ["mamba2", "mlp", "full_attention", "mamba2"],
}


def make_tiny_hybrid(root: Path, name: str, seed: int = 0, **overrides: Any) -> TinySsm:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kwargs = HYBRID_FAMILIES[name]
    cfg = AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _randomise(hf, seed)
    path = root / name
    hf.save_pretrained(path)
    return TinySsm(name, path, hf)


_CACHE: dict[str, TinySsm] = {}
_MODELS: dict[str, Any] = {}


def tiny_hybrid(name: str) -> TinySsm:
    """The tiny checkpoint `name`, built once per process (in a temporary directory)."""
    import atexit
    import shutil
    import tempfile

    if name not in _CACHE:
        root = tempfile.mkdtemp(prefix="tiny_hybrid_")
        atexit.register(shutil.rmtree, root, ignore_errors=True)  # leave no files behind
        _CACHE[name] = make_tiny_hybrid(Path(root), name)
    return _CACHE[name]


def hybrid_model(name: str) -> Any:
    """Our MIModel of the tiny checkpoint `name` (loaded through the plugins, once)."""
    import mi_core as mi

    if name not in _MODELS:
        _MODELS[name] = mi.MIModel.from_pretrained(tiny_hybrid(name).path)
    return _MODELS[name]
