"""Every supported family as transformers builds it from its config class's DEFAULTS.

A researcher (or an acceptance test) often makes a tiny checkpoint by calling a family's
config class with a few sizes and keeping every other default: the defaults then choose the
schedule (Nemotron-H's default has a mixture-of-experts layer, OLMo hybrid's value heads are
twice as wide as its key heads, ERNIE-4.5-MoE's class has no head_dim, DeepSeek's keeps
``num_key_value_heads`` apart from the head count). Here each ``model_type`` of
mi_transformer's ``FAMILIES`` is built that way, with only sizes shrunk (:data:`SHRINK`, where
the class has the field) and, where transformers itself cannot build or run its defaults at
that size, the least it needs (:data:`NEEDS`, each with why); weights are redrawn at unit
scale, the model saved with ``save_pretrained`` and loaded with ``MIModel.from_pretrained``,
and the F32 logits compared with transformers'.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any

import pytest
import torch

import mi_core as mi
from mi_transformer.config import FAMILIES
from tests.support.family_checks import logits_tol

transformers = pytest.importorskip("transformers")

#: Sizes only (applied where the config class has the field); every other field keeps its
#: default.
SHRINK: dict[str, Any] = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
    num_local_experts=8, n_routed_experts=8, num_experts_per_tok=2, kv_lora_rank=16,
    q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=2,
    topk_group=1, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
    linear_value_head_dim=16, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
    ssm_state_size=16, state_size=16, n_groups=1, mamba_n_groups=1, mamba_headdim=16,
    num_heads=8, time_step_rank=8, sliding_window=8, attention_chunk_size=8,
    hidden_size_per_layer_input=8, vocab_size_per_layer_input=128, laurel_rank=8, d_model=64,
    n_layer=4, n_embd=64, n_head=4, num_layers=4, moe_shared_expert_intermediate_size=48,
    global_head_dim=16, first_k_dense_replace=1, shared_intermediate_size=48)

#: What transformers needs beyond sizes to build or run its own defaults at this size.
NEEDS: dict[str, dict[str, Any]] = {
    # default pad ids beyond a 128-token vocabulary (nn.Embedding's padding_idx check)
    **{mt: {"pad_token_id": 0} for mt in ("glm", "glm4", "phi3", "smollm3", "olmo_hybrid",
                                           "gemma3n_text")},
    # default attention layer indices beyond 4 layers: transformers' cache then fails
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["mamba", "attention", "mamba", "attention"]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
              "expert_layer_offset": 1},
    "zamba2": {"layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
               "hybrid_layer_ids": [1, 3], "pad_token_id": 0},
    "lfm2_moe": {"layer_types": ["conv", "full_attention", "conv", "full_attention"]},
    # the default KV sharing (15 layers) and layer schedule are for 30+ layers
    "gemma3n_text": {"pad_token_id": 0, "num_kv_shared_layers": 2,
                     "layer_types": ["sliding_attention", "full_attention"] * 2},
    # transformers checks mamba_d_ssm = heads * head width
    "falcon_h1": {"mamba_d_ssm": 128, "pad_token_id": 0},
    # the default rotary_dim (64) is wider than a 16-wide head
    "gptj": {"rotary_dim": 8},
}

#: Multimodal wrappers: (the text model's type, a small vision config, extra text fields).
WRAPPERS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "llama4": ("llama4_text", {"hidden_size": 32, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "intermediate_size": 32,
                               "image_size": 28, "patch_size": 14, "vision_output_dim": 32,
                               "projector_input_dim": 32, "projector_output_dim": 32},
               {"pad_token_id": 0}),
    "gemma4": ("gemma4_text", {"hidden_size": 32, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "intermediate_size": 32},
               {"pad_token_id": 0, "num_kv_shared_layers": 0}),
    "gemma3": ("gemma3_text", {"hidden_size": 32, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "intermediate_size": 32,
                               "image_size": 28, "patch_size": 14}, {}),
    "qwen3_5": ("qwen3_5_text", {"hidden_size": 32, "depth": 1, "num_heads": 2,
                                 "intermediate_size": 32, "out_hidden_size": 64},
                {"pad_token_id": 0}),
    "qwen3_5_moe": ("qwen3_5_moe_text", {"hidden_size": 32, "depth": 1, "num_heads": 2,
                                         "intermediate_size": 32, "out_hidden_size": 64},
                    {"pad_token_id": 0}),
}

#: Not built here, with why.
SKIPPED = {"gemma3n": "its wrapper class needs timm (not a dependency); gemma3n_text is built"}


def _fields(cls: type) -> set[str]:
    names = set(inspect.signature(cls.__init__).parameters)
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    return names


def _shrunk(model_type: str, extra: dict[str, Any]) -> dict[str, Any]:
    cls = transformers.CONFIG_MAPPING[model_type]
    return {**{k: v for k, v in SHRINK.items() if k in _fields(cls)},
            **NEEDS.get(model_type, {}), **extra}


def _build(model_type: str) -> torch.nn.Module:
    mapping = transformers.CONFIG_MAPPING
    if model_type in WRAPPERS:
        text_type, vision, extra = WRAPPERS[model_type]
        cfg = mapping[model_type](text_config=_shrunk(text_type, extra), vision_config=vision)
        model = transformers.AutoModelForImageTextToText.from_config(cfg)
    else:
        cfg = mapping[model_type](**_shrunk(model_type, {}))
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # unit-scale weights: transformers' init (std 0.02) hides errors
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model.eval().float()


def _reference_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        try:
            return model(input_ids=ids).logits
        except AttributeError:  # transformers 5.24's Llama4ForConditionalGeneration text-only
            return model.language_model(input_ids=ids).logits


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_family_built_from_transformers_defaults_loads_with_its_logits(model_type, tmp_path):
    if model_type in SKIPPED:
        pytest.skip(SKIPPED[model_type])
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _build(model_type)
        model.save_pretrained(tmp_path)
        ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(1))
        want = _reference_logits(model, ids)
    got = mi.MIModel.from_pretrained(tmp_path).forward(ids).output
    assert got.shape == want.shape
    assert (got.float() - want.float()).abs().max().item() < logits_tol(model_type)
