"""Weight processing at load as TransformerLens' ``from_pretrained`` decides it: a flag the
architecture cannot take is turned off with a warning instead of refusing the model
(TransformerLens does so for soft-capped logits, post-norm and shortformer models); the
kernel's ``process_weights`` still refuses it, typed, when asked directly."""

from __future__ import annotations

import logging

import pytest
import torch

import mi_core as mi
from mi_core.tl import HookedTransformer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory):
    cfg = transformers.Gemma2Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, pad_token_id=0,
        final_logit_softcapping=5.0, attn_logit_softcapping=20.0, sliding_window=4)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    path = tmp_path_factory.mktemp("gemma2")
    model.save_pretrained(path)
    return path


def test_from_pretrained_on_a_soft_capped_model_turns_center_unembed_off_with_a_warning(
        gemma2_dir, caplog):
    with caplog.at_level(logging.WARNING):
        tl = HookedTransformer.from_pretrained(gemma2_dir)
    assert any("center_unembed=False" in r.getMessage() for r in caplog.records)
    ids = torch.tensor([[1, 5, 9, 17, 33, 65, 2, 7]])
    want = mi.MIModel.from_pretrained(gemma2_dir).forward(ids).output
    assert (tl(ids) - want).abs().max().item() < 1e-4  # folding and centring keep the logits


def test_the_kernel_still_refuses_center_unembed_under_a_soft_cap(gemma2_dir):
    model = mi.MIModel.from_pretrained(gemma2_dir)
    with pytest.raises(mi.MIError, match="center_unembed"):
        model.process_weights(fold_ln=False, center_writing_weights=False, center_unembed=True,
                              fold_value_biases=False)


@pytest.mark.parametrize("model_type, flags", [
    ("mamba", "fold_ln=False, center_writing_weights=False"),  # sequence mixers
    ("gpt_oss", "fold_value_biases=False"),  # attention sinks (its MoE refuses folding too)
    ("gemma3n_text", "fold_ln=False, center_writing_weights=False"),  # Laurel blocks
])
def test_from_pretrained_loads_without_the_processing_a_model_cannot_take(
        model_type, flags, tmp_path, caplog):
    from tests.transformer.test_transformer_default_configs import _build, _reference_logits

    hf = _build(model_type)
    hf.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        tl = HookedTransformer.from_pretrained(tmp_path)
    assert any(flags in r.getMessage() for r in caplog.records)
    ids = torch.tensor([[1, 5, 9, 17, 33, 65, 2, 7]])
    want = _reference_logits(hf, ids).log_softmax(-1)
    assert (tl(ids).log_softmax(-1) - want).abs().max().item() < 1e-4
