"""Tiny random linear-attention hybrid checkpoints made with `transformers` (Qwen3-Next,
Qwen3.5 text and MoE text, Qwen3.5 and Qwen3.5-MoE as released: the multimodal wrapper,
OLMo hybrid), for tests/ssm/test_ssm_linear_*.py.

Unit scale with the settings released checkpoints use: fewer key heads than value heads in
the gated DeltaNet (2 / 4, as 16 / 32), head_dim larger than hidden / heads, grouped-query
attention with the output gate, partial rotary (transformers' default 0.25), the schedule
[linear, linear, linear, full] (full_attention_interval 4), Qwen3-Next's MoE with a gated
shared expert and top-k renormalised; the Qwen3.5 ones with the released rotary dict (mRoPE
sections and the interleaved flag, which text-only positions make plain rotary) and, for the
wrappers, a one-block vision tower the text-only forward never runs (drawn from its own
generator, so the language model's weights are the text model's; untied: a head of N(0, 1)
embeddings gives logits of ~25, the tie is tested apart). Embeddings N(0, 1); every matrix
N(0, 1 / fan_in); the (1 + w) norms' w = 0.1 N(0, 1), the gated norm's gain 1 + 0.1 N(0, 1);
A_log and dt_bias around transformers' initialisation (decays up to ~16 nats a token, as
trained models have).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.ssm_tiny import TinySsm

VOCAB, HIDDEN, LAYERS = 64, 32, 4

_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               intermediate_size=48, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
               pad_token_id=0, bos_token_id=1, eos_token_id=2)

_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=24)
#: Qwen3.5's released rotary dict (rope_theta 1e7, 0.25 of each head rotated, the mRoPE split
#: of the rotated frequencies: 16 x 0.25 = 4 dims, 2 frequencies)
_QWEN35_ROPE = dict(rope_type="default", rope_theta=10_000_000.0, partial_rotary_factor=0.25,
                    mrope_section=[1, 1, 0], mrope_interleaved=True)
_QWEN35 = dict({k: v for k, v in _COMMON.items() if k != "intermediate_size"},
               rope_parameters=_QWEN35_ROPE)
_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=2,
               spatial_merge_size=1, temporal_patch_size=1, num_position_embeddings=16,
               out_hidden_size=HIDDEN)

#: name -> (model_type, config)
LINEAR_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_next": ("qwen3_next", dict(_COMMON, **_MOE)),
    "qwen3_5_text": ("qwen3_5_text", dict(_COMMON)),
    "qwen3_5_moe_text": ("qwen3_5_moe_text", dict(_QWEN35, **_MOE)),
    "qwen3_5": ("qwen3_5", dict(text_config=dict(_QWEN35, intermediate_size=48),
                                vision_config=_VISION)),
    "qwen3_5_moe": ("qwen3_5_moe", dict(text_config=dict(_QWEN35, **_MOE),
                                        vision_config=_VISION)),
    # OLMo hybrid as released: no rotary (rope_parameters null), beta in (0, 2). Key and
    # value widths equal (2 x 16 = 4 x 8); transformers saves the q/k/v convs in equal thirds
    # whatever their widths: the uneven case is tests/transformer/test_transformer_saved_layouts.py
    "olmo_hybrid": ("olmo_hybrid", dict({k: v for k, v in _COMMON.items() if k != "head_dim"},
                                        linear_key_head_dim=16, rope_parameters=None)),
}


def _randomise(model: torch.nn.Module, seed: int, zero_centred: bool) -> None:
    """The vision tower of a wrapper draws from its own generator: the language model then
    gets the draws the text-only model of the same config gets (same weights, same seed)."""
    g = torch.Generator().manual_seed(seed)
    g_vision = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g_vision if ".visual." in name else g)
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.linspace(0.5, 16.0, p.numel())) + 0.1 * noise)
            elif name.endswith("dt_bias"):
                p.copy_(1.0 + 0.3 * noise)
            elif "embed" in name:
                p.copy_(noise)
            elif name.endswith(("linear_attn.norm.weight", "o_norm.weight")) or (
                    "norm" in name and not zero_centred):  # gains w
                p.copy_(1.0 + 0.1 * noise)
            elif "norm" in name:  # (1 + w) norms
                p.copy_(0.1 * noise)
            elif p.dim() == 1:
                p.copy_(0.1 * noise)
            else:  # [out, in], conv [channels, 1, kernel], experts [E, out, in]
                p.copy_(noise / math.sqrt(p.shape[-1]))


def make_tiny_linear(root: Path, name: str, seed: int = 0, **overrides: Any) -> TinySsm:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    model_type, kwargs = LINEAR_FAMILIES[name]
    cfg = AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    torch.manual_seed(seed)
    # the released classes of the multimodal configs: the conditional-generation wrappers
    auto = AutoModelForImageTextToText if "text_config" in kwargs else AutoModelForCausalLM
    hf = auto.from_config(cfg, dtype=torch.float32).eval()
    _randomise(hf, seed, zero_centred=model_type != "olmo_hybrid")
    path = root / name
    hf.save_pretrained(path)
    return TinySsm(name, path, hf)


_CACHE: dict[str, TinySsm] = {}
_MODELS: dict[str, Any] = {}


@pytest.fixture(scope="session")
def tiny_linear(tmp_path_factory: pytest.TempPathFactory):
    """tiny_linear(name) -> TinySsm (the checkpoint and transformers' model), built once."""
    root = tmp_path_factory.mktemp("tiny_linear")

    def get(name: str) -> TinySsm:
        if name not in _CACHE:
            _CACHE[name] = make_tiny_linear(root, name)
        return _CACHE[name]

    return get


@pytest.fixture(scope="session")
def linear_model(tiny_linear):
    """linear_model(name) -> our MIModel of that tiny checkpoint (loaded once)."""
    import mi_core as mi

    def get(name: str) -> Any:
        if name not in _MODELS:
            _MODELS[name] = mi.MIModel.from_pretrained(tiny_linear(name).path)
        return _MODELS[name]

    return get
