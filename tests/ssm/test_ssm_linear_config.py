"""Config and checkpoint strictness of the gated DeltaNet hybrids: a released Qwen3-Next config
parses to the right schedule, rotary width and MoE; keys that would change the numbers are
refused by name; a file transformers 5.23 re-saved with its OLMo hybrid convs split at the
wrong widths is refused, not guessed."""

from __future__ import annotations

import pytest

import mi_core as mi
from mi_transformer.config import parse_config

from tests.support.linear_tiny import make_tiny_linear

#: Qwen/Qwen3-Next-80B-A3B-Instruct's config.json as published on the hub (transcribed; no
#: hub access here to re-read it), every key kept.
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
    "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5120, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_value_head_dim": 128, "max_position_embeddings": 262144, "mlp_only_layers": [],
    "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": True,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10,
    "num_hidden_layers": 48, "num_key_value_heads": 2, "output_router_logits": False,
    "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.57.0.dev0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}


def test_the_released_qwen3_next_config_parses_to_its_schedule() -> None:
    c = parse_config(QWEN3_NEXT_80B, "config.json")
    assert c.layer_mixers[:4] == ("gated_deltanet",) * 3 + ("attention",)
    assert c.layer_mixers.count("attention") == 12 and c.rot_dim == 64  # 256 * 0.25
    assert c.moe.num_experts == 512 and c.moe.shared_expert_gate and all(c.layer_moe)
    s = c.mixers[0].settings
    assert (s.k_heads, s.v_heads, s.d_k, s.d_v, s.layout) == (16, 32, 128, 128, "fused")


@pytest.mark.parametrize("change, match", [
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"layer_types": ["linear_attention"] * 47 + ["sliding_attention"]}, "sliding_attention"),
    ({"linear_num_value_heads": 24, "linear_num_key_heads": 16}, "multiple of the 16 key"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"some_new_key": 1}, "some_new_key"),
])
def test_keys_that_would_change_the_numbers_are_refused_by_name(change, match: str) -> None:
    with pytest.raises(mi.ConfigError, match=match):
        parse_config({**QWEN3_NEXT_80B, **change}, "config.json")


def test_an_olmo_hybrid_file_with_convs_split_in_equal_thirds_loads(tmp_path) -> None:
    """Key width 2 x 8 = 16, value width 4 x 16 = 64: transformers saves the q/k/v convs as
    three equal 32-channel thirds of the 96 (its reverse conversion) and reads them back as
    one concatenation; so do we (re-split at 16 / 16 / 64), with its numbers (2e-4: the
    gated-DeltaNet bound, docs/DEVIATIONS.md)."""
    import torch

    t = make_tiny_linear(tmp_path, "olmo_hybrid", linear_key_head_dim=8,
                         linear_value_head_dim=16)
    ids = torch.randint(3, 60, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = t.hf(ids).logits
    got = mi.MIModel.from_pretrained(t.path).forward(ids).output
    assert (got - want).abs().max().item() < 2e-4
