"""Tiny checkpoints of gpt-oss, DeepSeek-V2/V3 and Llama 4 text, made with `transformers`.

Each config exercises what makes the family different, with the awkward settings published
checkpoints use and values away from their defaults so that a wrong one shows: sliding and
full layers mixed (window 5, shorter than the 12..24-token prompts), yarn whose original
length (8) the prompts pass, a SwiGLU clamp (0.5) the unit-scale activations reach, MLA with
and without a q latent, V2's group-limited and V3's sigmoid routing with a selection bias
(randomised: transformers initialises it to zero), routed scaling, first dense layers,
chunked attention (chunk 4), a NoPE layer with temperature tuning (floor 2), a dense layer
between MoE ones. `make_moe2(root, name)` builds one like tests/transformer/conftest.py's
`make_tiny` (unit-scale weights, eager attention, F32) and also randomises the buffers
transformers leaves at zero.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from tests.support.tiny_families import _COMMON

WINDOW = 5
_MIXED = ["sliding_attention", "full_attention", "sliding_attention"]
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
         "beta_fast": 8.0, "beta_slow": 1.0, "rope_theta": 300.0}
# DeepSeek's yarn: mscale / mscale_all_dim that differ, so both the cos/sin factor and the
# softmax scale move away from 1
_DS_YARN = dict(_YARN, mscale=0.8, mscale_all_dim=0.6)
_MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
            num_key_value_heads=4, moe_intermediate_size=32, first_k_dense_replace=1)

#: name -> (model_type, config overrides on tiny_families._COMMON)
MOE2_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt_oss": ("gpt_oss", dict(intermediate_size=32, head_dim=24, num_local_experts=4,
                                num_experts_per_tok=2, sliding_window=WINDOW, layer_types=_MIXED,
                                swiglu_limit=0.5, swiglu_alpha=1.2,
                                rope_parameters=dict(_YARN, truncate=False))),
    # DeepSeek-V2-Lite style: queries from one projection, greedy routing, 2 shared experts
    "deepseek_v2_lite": ("deepseek_v2", dict(_MLA, q_lora_rank=None, n_routed_experts=4,
                                             num_experts_per_tok=2, n_shared_experts=2,
                                             rope_parameters=_DS_YARN)),
    # DeepSeek-V2 style: q latent, group-limited routing, routed scaling, attention biases
    "deepseek_v2": ("deepseek_v2", dict(_MLA, q_lora_rank=24, n_routed_experts=8,
                                        num_experts_per_tok=2, n_shared_experts=1, n_group=4,
                                        topk_group=2, topk_method="group_limited_greedy",
                                        routed_scaling_factor=1.5, attention_bias=True,
                                        rope_parameters=_DS_YARN)),
    "deepseek_v3": ("deepseek_v3", dict(_MLA, q_lora_rank=24, n_routed_experts=8,
                                        num_experts_per_tok=2, n_shared_experts=1, n_group=4,
                                        topk_group=2, routed_scaling_factor=2.5,
                                        rope_parameters=_DS_YARN)),
    "deepseek_v3_half": ("deepseek_v3", dict(_MLA, q_lora_rank=24, n_routed_experts=8,
                                             num_experts_per_tok=3, n_shared_experts=1,
                                             n_group=2, topk_group=1, rope_interleave=False,
                                             norm_topk_prob=False)),
    # layer 1: no RoPE (temperature tuning), full attention, dense MLP; layers 0 and 2:
    # RoPE, q/k L2 norm, chunked attention; layer 1 MoE via interleave_moe_layer_step 2
    "llama4_text": ("llama4_text", dict(intermediate_size=32, intermediate_size_mlp=96,
                                        head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                        interleave_moe_layer_step=2, attention_chunk_size=4,
                                        no_rope_layers=[1, 0, 1], floor_scale=2, attn_scale=0.5,
                                        rope_parameters={"rope_type": "default",
                                                         "rope_theta": 300.0})),
}


def randomise_buffers(model: torch.nn.Module, seed: int) -> None:
    """Buffers that are weights in the checkpoint but zero after transformers' init
    (DeepSeek-V3's ``e_score_correction_bias``): random, so a wrong use shows."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=g))


def build_tiny(families: dict[str, tuple[str, dict[str, Any]]],
               randomise_extra: Callable[[torch.nn.Module, int], None], root: Path, name: str,
               seed: int = 0) -> Any:
    """The tiny checkpoint `name` of `families` (on tiny_families' common sizes), weights at
    unit scale, then `randomise_extra` for what the family keeps outside its parameters;
    saved under `root`; a tests.transformer.conftest.Tiny."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.transformer.conftest import Tiny, _randomise

    model_type, overrides = families[name]
    cfg = AutoConfig.for_model(model_type, **{**_COMMON, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                             dtype=torch.float32).eval()
    _randomise(model, seed)
    randomise_extra(model, seed)
    path = root / name
    model.save_pretrained(path)
    return Tiny(name, path, model)


def session_cache(make: Callable[[Path, str], Any], prefix: str
                  ) -> Callable[[Any], Callable[[str], Any]]:
    """`cached(root_factory)` -> `get(name)`: each checkpoint `make` builds once per session
    (`root_factory`: pytest's ``tmp_path_factory``), shared by the test modules."""
    cache: dict[str, Any] = {}

    def cached(root_factory: Any) -> Callable[[str], Any]:
        def get(name: str) -> Any:
            if name not in cache:
                cache[name] = make(root_factory.mktemp(prefix), name)
            return cache[name]
        return get

    return cached


def make_moe2(root: Path, name: str, seed: int = 0) -> Any:
    """The tiny checkpoint `name` of :data:`MOE2_FAMILIES`, saved under `root`."""
    return build_tiny(MOE2_FAMILIES, randomise_buffers, root, name, seed)


cached_moe2 = session_cache(make_moe2, "moe2")
