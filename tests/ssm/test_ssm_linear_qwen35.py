"""Qwen3.5 as released: the multimodal wrappers (``qwen3_5``, ``qwen3_5_moe``) load their
language model text-only, ``qwen3_5_moe_text`` is a family, and the mRoPE keys are accepted
where they cannot change a text-only forward. (Parity of the three against transformers 5.24
on tiny checkpoints, padding, cached generation and to_dict configs: the parametrized tests
of test_ssm_linear_parity.py / test_ssm_hybrid_to_dict.py, tests/support/linear_tiny.py.)

Reference for the mRoPE claim: transformers' own rotary modules (``Qwen3_5TextRotaryEmbedding``,
interleaved; ``Qwen2VLRotaryEmbedding``, contiguous sections) against its plain partial rotary
(``Qwen3NextRotaryEmbedding``) at the released shape (head_dim 256, 0.25 rotated, theta 1e7).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import mi_core as mi
from mi_core.interp import LogitLensAnalysis, run_state_knockout
from mi_transformer.config import parse_config

from tests.support.linear_tiny import make_tiny_linear, linear_model, tiny_linear  # noqa: F401
from tests.support.published_configs import DIR
from tests.support.ssm_tiny import ssm_ids

DENSE = json.loads((DIR / "Qwen__Qwen3.5-27B.reconstructed.json").read_text())
MOE = json.loads((DIR / "Qwen__Qwen3.5-35B-A3B.reconstructed.json").read_text())
_SECTIONS = ([11, 11, 10], [16, 8, 8], [32, 0, 0], [0, 0, 32])


def _rotaries(section: list[int]) -> tuple[Any, Any, Any]:
    """transformers' interleaved mRoPE (Qwen3.5), its contiguous mRoPE (Qwen2-VL) and its
    plain partial rotary (Qwen3-Next) over the same 32 frequencies of theta 1e7."""
    from transformers import Qwen2VLTextConfig, Qwen3_5TextConfig, Qwen3NextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRotaryEmbedding

    rope = dict(rope_type="default", rope_theta=1e7, mrope_section=section,
                mrope_interleaved=True)
    inter = Qwen3_5TextRotaryEmbedding(Qwen3_5TextConfig(
        head_dim=256, rope_parameters=dict(rope, partial_rotary_factor=0.25)))
    contiguous = Qwen2VLRotaryEmbedding(Qwen2VLTextConfig(
        hidden_size=1024, num_attention_heads=16, rope_parameters=rope))  # head_dim 64
    plain = Qwen3NextRotaryEmbedding(Qwen3NextConfig(
        head_dim=256, rope_parameters=dict(rope_type="default", rope_theta=1e7,
                                           partial_rotary_factor=0.25)))
    return inter, contiguous, plain


@pytest.mark.parametrize("section", _SECTIONS)
def test_text_only_positions_make_either_mrope_layout_plain_rotary(section) -> None:
    """Text-only input: the temporal / height / width rows are one position each, so every
    frequency reads it whatever the split or layout; bitwise equal to plain rotary. With
    distinct rows (an image's grid) the split matters: the check is not vacuous."""
    inter, contiguous, plain = _rotaries(section)
    x = torch.zeros(1)
    pos = torch.arange(300).view(1, -1).expand(2, -1) + torch.tensor([[0], [7]])
    want = plain(x, pos)
    for rotary in (inter, contiguous):
        got = rotary(x, pos)
        assert got[0].shape == want[0].shape == (2, 300, 64)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    grid = torch.stack([pos, pos // 4, pos % 4])  # distinct rows: positions of an image
    if max(section) < 32:  # a split that gives some frequency to another row
        assert not torch.equal(inter(x, grid)[0], want[0])
        assert not torch.equal(contiguous(x, grid)[0], want[0])


def test_the_released_configs_parse_to_their_language_models() -> None:
    d = parse_config(DENSE, "config.json")
    assert (d.model_type, d.weight_names, d.num_layers, d.hidden_size) == (
        "qwen3_5", "qwen3_5_mm", 64, 5120)
    assert d.layer_mixers[:4] == ("gated_deltanet",) * 3 + ("attention",)
    assert d.rot_dim == 64 and d.ropes[0].theta == 1e7 and d.moe is None
    assert not d.tie_word_embeddings
    s = d.mixers[0].settings
    assert (s.k_heads, s.v_heads, s.d_k, s.d_v, s.layout) == (16, 48, 128, 128, "separate")
    m = parse_config(MOE, "config.json")
    assert (m.model_type, m.num_layers, m.rot_dim) == ("qwen3_5_moe", 40, 64)
    assert m.moe.num_experts == 256 and m.moe.top_k == 8 and m.moe.norm_topk_prob
    assert m.moe.shared_expert_size == 512 and m.moe.shared_expert_gate and all(m.layer_moe)
    # the text configs alone are the text families
    assert parse_config(DENSE["text_config"], "t.json").model_type == "qwen3_5_text"
    assert parse_config(MOE["text_config"], "t.json").model_type == "qwen3_5_moe_text"


def _with_text(cfg: dict[str, Any], **change: Any) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    out["text_config"].update(change)
    return out


def _rope(**change: Any) -> dict[str, Any]:
    return dict(DENSE["text_config"]["rope_parameters"], **change)


@pytest.mark.parametrize("cfg, match", [
    (_with_text(DENSE, rope_parameters=_rope(mrope_section=[11, 11])), "mrope_section"),
    (_with_text(DENSE, rope_parameters=_rope(mrope_section=[11, 11, 11])), "summing to 32"),
    (_with_text(DENSE, rope_parameters=_rope(mrope_section=[-1, 23, 10])), "mrope_section"),
    (_with_text(DENSE, rope_parameters=_rope(mrope_section=["a", "b", "c"])), "mrope_section"),
    (_with_text(DENSE, rope_parameters=_rope(mrope_interleaved="yes")), "mrope_interleaved"),
    (_with_text(DENSE, rope_parameters=_rope(mrope_axes=[0, 1, 2])), "mrope_axes"),
    (_with_text(DENSE, model_type="qwen3_5_moe_text"), "qwen3_5_moe_text"),
    (_with_text(DENSE, mamba_ssm_dtype="bfloat16"), "mamba_ssm_dtype"),
    (_with_text(DENSE, attn_output_gate=False), "attn_output_gate"),
    (_with_text(DENSE, some_new_key=1), "some_new_key"),
    (_with_text(MOE, norm_topk_prob=False), "norm_topk_prob"),
    (_with_text(MOE, decoder_sparse_step=2), "decoder_sparse_step"),
    (_with_text(MOE, mlp_only_layers=[0]), "mlp_only_layers"),
    ({k: v for k, v in MOE.items() if k != "text_config"}, "text_config"),
])
def test_keys_that_would_change_the_numbers_are_refused_by_name(cfg, match: str) -> None:
    with pytest.raises(mi.ConfigError, match=match):
        parse_config(cfg, "config.json")


def test_the_wrapper_s_own_tie_flag_decides_as_in_transformers(tmp_path) -> None:
    """transformers ties a wrapper's head by its top-level flag (default false), not the
    text config's."""
    t = make_tiny_linear(tmp_path, "qwen3_5", tie_word_embeddings=True)
    hf = t.hf
    assert hf.lm_head.weight.data_ptr() == hf.model.language_model.embed_tokens.weight.data_ptr()
    model = mi.MIModel.from_pretrained(t.path)
    ids = ssm_ids(1, 9, seed=6)
    with torch.no_grad():
        want = hf(ids).logits
    got = model.forward(ids).output  # N(0, 1) embeddings as the head: logits up to ~24
    assert (got - want).abs().max().item() < 1e-4 and want.abs().max().item() > 10
    cfg = json.loads((t.path / "config.json").read_text())
    cfg.pop("tie_word_embeddings")
    cfg["text_config"]["tie_word_embeddings"] = True
    assert not parse_config(cfg, "config.json").tie_word_embeddings


def test_the_mtp_block_and_the_vision_tower_are_not_loaded(tiny_linear, tmp_path) -> None:
    """Released checkpoints also hold the multi-token-prediction block (mtp.*), which the
    causal-LM forward does not run (transformers ignores it); any other stray tensor is
    still refused."""
    t = tiny_linear("qwen3_5_moe")
    tensors = load_file(str(t.path / "model.safetensors"))
    assert any(k.startswith("model.visual.") for k in tensors)
    d = tmp_path / "with_mtp"
    d.mkdir()
    (d / "config.json").write_text((t.path / "config.json").read_text())
    save_file({**tensors, "mtp.fc.weight": torch.zeros(32, 64),
               "mtp.layers.0.mlp.experts.gate_up_proj": torch.zeros(4, 32, 32)},
              str(d / "model.safetensors"))
    ids = ssm_ids(1, 9, seed=7)
    with torch.no_grad():
        want = t.hf(ids).logits
    assert (mi.MIModel.from_pretrained(d).forward(ids).output - want).abs().max() < 2e-4
    save_file({**tensors, "model.language_model.stray.weight": torch.zeros(2)},
              str(d / "model.safetensors"))
    with pytest.raises(mi.WeightLoadError, match="stray"):
        mi.MIModel.from_pretrained(d)


def test_hooks_and_analyses_on_the_moe_wrapper(linear_model) -> None:
    """Expert and router points on every layer, state points on the DeltaNet layers; state
    knockout, the logit lens and an expert ablation run."""
    model = linear_model("qwen3_5_moe")
    points = {str(p) for p in model.hook_points()}
    assert {"blocks.0.mlp.experts.3.hook_out", "blocks.3.mlp.hook_router_logits",
            "blocks.0.attn.hook_state", "blocks.3.attn.hook_pattern"} <= points
    assert model.layer_types == ["gated_deltanet"] * 3 + ["full_attention"]
    ids = ssm_ids(1, 9, seed=8)
    ko = run_state_knockout(model, ids, mi.StateKnockoutSpec(positions=[3]))
    assert ko.kl_divergence() > 0
    lens = LogitLensAnalysis().run(model, ids, position=-1)
    base = model.forward(ids).output
    assert lens.points[-1].top[0].token_id == int(base[0, -1].argmax())
    spec = mi.HookSpec().intervene("blocks.1.mlp.experts.0.hook_out", lambda t, ctx: t * 0)
    assert (model.forward(ids, spec).output - base).abs().max().item() > 0
