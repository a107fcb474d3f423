"""Tiny random Falcon-H1 and LFM2 checkpoints made with `transformers` (the hybrids whose layer
shape is new: attention beside Mamba-2 in every layer; a gated short convolution).

The unit-scale recipe of tests/support/ssm_tiny.py, with the settings the released
checkpoints use, shrunk:

- ``falcon_h1``: Falcon-H1-0.5B's recipe: Mamba-2 without the gated norm
  (``mamba_rms_norm: false``), d_inner set apart from expand (``mamba_d_ssm`` 48 = 8 heads x
  6, not 2 x 32), one group, an attention head_dim (12) that is not hidden / heads, grouped
  query attention, RoPE base 1e11, and its multipliers (embedding 5.657, key 0.3906,
  attention out 0.9375, ssm in 1.25 / out 0.2357, the five ssm multipliers, MLP [0.8839,
  0.5859]) except ``lm_head_multiplier``: the released 0.039 would shrink these unit-scale
  logits to ~0.04 and the 1e-4 comparison with them, so 0.75 (the same arithmetic); a chunk
  (8) shorter than the prompts.
- ``falcon_h1_norm``: the gated RMS norm before the gate in 2 groups (``mamba_rms_norm``,
  ``mamba_norm_before_gate``), biases on out_proj (``projectors_bias``) and in attention,
  ``attention_in_multiplier`` != 1 (Falcon-H1-1.5B-Deep's variant of the mixer).
- ``lfm2``: LFM2-350M's schedule (conv, conv, attention, ...), tied embeddings, no conv bias,
  a window of 3, grouped-query attention with q/k norms, the auto-adjusted MLP width.
- ``lfm2_bias``: the same with ``conv_bias: true`` (no released checkpoint has it; the
  bias path of the convolution and of its projections) and an untied head.
- ``lfm2_moe``: LFM2-8B-A1B's recipe shrunk: a dense first layer, then top-2 of 4 experts
  chosen by sigmoid score + expert bias (the bias random, N(0, 0.2^2): transformers
  initialises it to zeros, which would leave the choice untested), renormalised, scaled by
  1.5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.support.ssm_tiny import VOCAB, TinySsm, _randomise

_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
_FALCON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, head_dim=12, mamba_d_ssm=48,
               mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=1, mamba_d_state=8,
               mamba_chunk_size=8, mamba_rms_norm=False, mamba_norm_before_gate=False,
               rope_theta=1e11, embedding_multiplier=5.656854249492381,
               lm_head_multiplier=0.75, key_multiplier=0.39062499999999994,
               attention_in_multiplier=1.0, attention_out_multiplier=0.9375,
               ssm_in_multiplier=1.25, ssm_out_multiplier=0.23570226039551587,
               ssm_multipliers=[0.3535533905932738, 0.25, 0.3535533905932738, 0.5,
                                0.3535533905932738],
               mlp_multipliers=[0.8838834764831844, 0.5859375], **_IDS)
_LFM2 = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=96, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, block_multiple_of=16,
             layer_types=["conv", "conv", "full_attention", "conv"], conv_L_cache=3, **_IDS)

#: name -> (model_type, config)
HYBRID2_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "falcon_h1": ("falcon_h1", _FALCON),
    "falcon_h1_norm": ("falcon_h1", {**_FALCON, "num_hidden_layers": 2, "mamba_n_groups": 2,
                                     "mamba_rms_norm": True, "mamba_norm_before_gate": True,
                                     "projectors_bias": True, "attention_bias": True,
                                     "attention_in_multiplier": 1.3}),
    "lfm2": ("lfm2", _LFM2),
    "lfm2_bias": ("lfm2", {**_LFM2, "num_hidden_layers": 2, "conv_bias": True,
                           "tie_word_embeddings": False,
                           "layer_types": ["conv", "full_attention"]}),
    "lfm2_moe": ("lfm2_moe", dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                  moe_intermediate_size=16, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2,
                                  layer_types=["conv", "full_attention", "conv", "conv"],
                                  num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
                                  routed_scaling_factor=1.5, **_IDS)),
}

#: name -> each layer's type as model.layer_types says it
HYBRID2_LAYER_TYPES: dict[str, list[str]] = {
    "falcon_h1": ["full_attention+mamba2"] * 3,
    "falcon_h1_norm": ["full_attention+mamba2"] * 2,
    "lfm2": ["short_conv", "short_conv", "full_attention", "short_conv"],
    "lfm2_bias": ["short_conv", "full_attention"],
    "lfm2_moe": ["short_conv", "full_attention", "short_conv", "short_conv"],
}


def make_tiny_hybrid2(root: Path, name: str, seed: int = 0, **overrides: Any) -> TinySsm:
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kwargs = HYBRID2_FAMILIES[name]
    cfg = AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _randomise(hf, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # LFM2's final norm is "embedding_norm": a gain, not an embedding
        for pname, p in hf.named_parameters():
            if pname.endswith("embedding_norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        for bname, b in hf.named_buffers():
            if bname.endswith("expert_bias"):  # a buffer: _randomise leaves it at zeros
                b.copy_(0.2 * torch.randn(b.shape, generator=g))
    path = root / name
    hf.save_pretrained(path)
    return TinySsm(name, path, hf)


_CACHE: dict[str, TinySsm] = {}
_MODELS: dict[str, Any] = {}


def tiny_hybrid2(name: str) -> TinySsm:
    """The tiny checkpoint `name`, built once per process (in a temporary directory)."""
    import atexit
    import shutil
    import tempfile

    if name not in _CACHE:
        root = tempfile.mkdtemp(prefix="tiny_hybrid2_")
        atexit.register(shutil.rmtree, root, ignore_errors=True)  # leave no files behind
        _CACHE[name] = make_tiny_hybrid2(Path(root), name)
    return _CACHE[name]


def hybrid2_model(name: str) -> Any:
    """Our MIModel of the tiny checkpoint `name` (loaded through the plugins, once)."""
    import mi_core as mi

    if name not in _MODELS:
        _MODELS[name] = mi.MIModel.from_pretrained(tiny_hybrid2(name).path)
    return _MODELS[name]
