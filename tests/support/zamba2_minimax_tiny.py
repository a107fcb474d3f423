"""Tiny random Zamba2 and MiniMax checkpoints made with `transformers`, for
tests/ssm/test_ssm_zamba2_*.py and tests/ssm/test_ssm_minimax_*.py.

The unit-scale recipe of tests/support/ssm_tiny.py (embeddings N(0, 1), matrices
N(0, 1 / fan_in), norm gains 1 + 0.1 N(0, 1), A_log / D / dt biases around transformers'
initialisation) with the settings released checkpoints use, shrunk:

- Zamba2 as Zamba2-1.2B / 7B: the shared block on some layers only, two weight sets used in
  turn (num_mem_blocks 2, the third use back on the first set), LoRA adapters on q / k / v
  and on the MLP (rank 4), RoPE in the shared attention (use_mem_rope), tied embeddings,
  GELU MLP; Mamba-2 with 8 heads in 2 groups and a chunk (8) shorter than the prompts. A
  second variant as Zamba2-2.7B: no q / k / v adapters, no RoPE, here with grouped-query
  attention, one weight set and projection biases.
- MiniMax as MiniMax-Text-01: lightning layers with an attention layer among them, head_dim
  larger than hidden / heads, GQA, 4 experts top-2, the released alpha (3.5566 = (2 * 80) **
  0.25) on every residual and betas != 1 here, a block size (8) shorter than the prompts.
  Its slopes are set to values of the released 64-head range (0.92 to 0.004 nats a token,
  transformers' formula for heads 0, 8, 24 and 63 of 64), the block-decay buffers
  recomputed from them as transformers does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.support.ssm_tiny import VOCAB, TinySsm, _randomise

_ZAMBA = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, intermediate_size=48,
              n_mamba_heads=8, mamba_ngroups=2, mamba_d_state=8, mamba_expand=2,
              chunk_size=8, adapter_rank=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)

#: name -> (model_type, config)
ZM_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "zamba2": ("zamba2", dict(_ZAMBA, num_hidden_layers=5, num_key_value_heads=4,
                              layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "hybrid"],
                              num_mem_blocks=2, use_shared_attention_adapter=True,
                              use_mem_rope=True)),
    "zamba2_gqa": ("zamba2", dict(_ZAMBA, num_hidden_layers=3, num_key_value_heads=2,
                                  layers_block_type=["hybrid", "mamba", "hybrid"],
                                  num_mem_blocks=1, use_shared_attention_adapter=False,
                                  use_mem_rope=False, add_bias_linear=True)),
    "minimax": ("minimax", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, block_size=8,
        layer_types=["linear_attention", "linear_attention", "full_attention",
                     "linear_attention"],
        full_attn_alpha_factor=3.5565588200778455, full_attn_beta_factor=0.9,
        linear_attn_alpha_factor=3.5565588200778455, linear_attn_beta_factor=0.8,
        mlp_alpha_factor=3.5565588200778455, mlp_beta_factor=1.1, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)),
}

#: name -> each layer's type as model.layer_types says it
ZM_LAYER_TYPES: dict[str, list[str]] = {
    "zamba2": ["mamba2", "shared_attention+mamba2", "mamba2", "shared_attention+mamba2",
               "shared_attention+mamba2"],
    "zamba2_gqa": ["shared_attention+mamba2", "mamba2", "shared_attention+mamba2"],
    "minimax": ["lightning_attention", "lightning_attention", "full_attention",
                "lightning_attention"],
}

#: transformers' slope formula, 64 heads: base^(h + 1), base = 2^(-8 / 64)
RELEASED_SLOPES = [2 ** (-8 / 64 * (h + 1)) for h in (0, 8, 24, 63)]


def _lightning_slopes(model: torch.nn.Module) -> None:
    """Each lightning layer's slopes: the released range times transformers' layer factor;
    the block decays recomputed from them (transformers' decay_factors)."""
    for module in model.modules():
        if type(module).__name__ == "MiniMaxLightningAttention":
            factor = 1 - module.layer_idx / (module.num_hidden_layers - 1 + 1e-5) + 1e-5
            slope = torch.tensor(RELEASED_SLOPES)[:, None, None] * factor
            with torch.no_grad():
                module.slope_rate.copy_(slope)
                for buf, value in zip(("query_decay", "key_decay", "diagonal_decay"),
                                      module.decay_factors(slope)):
                    getattr(module, buf).copy_(value)


def make_tiny_zm(root: Path, name: str, seed: int = 0, **overrides: Any) -> TinySsm:
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kwargs = ZM_FAMILIES[name]
    cfg = AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _randomise(hf, seed)
    if model_type == "minimax":
        _lightning_slopes(hf)
    path = root / name
    hf.save_pretrained(path)
    return TinySsm(name, path, hf)


_CACHE: dict[str, TinySsm] = {}
_MODELS: dict[str, Any] = {}


def tiny_zm(name: str) -> TinySsm:
    """The tiny checkpoint `name`, built once per process (in a temporary directory)."""
    import atexit
    import shutil
    import tempfile

    if name not in _CACHE:
        root = tempfile.mkdtemp(prefix="tiny_zm_")
        atexit.register(shutil.rmtree, root, ignore_errors=True)  # leave no files behind
        _CACHE[name] = make_tiny_zm(Path(root), name)
    return _CACHE[name]


def zm_model(name: str) -> Any:
    """Our MIModel of the tiny checkpoint `name` (loaded through the plugins, once)."""
    import mi_core as mi

    if name not in _MODELS:
        _MODELS[name] = mi.MIModel.from_pretrained(tiny_zm(name).path)
    return _MODELS[name]


def zm_ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """Token ids in [3, VOCAB) (no pad / bos / eos)."""
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
