"""Logits parity against independent implementations on the same random weights (F32).

References: the `rwkv` PyPI package (BlinkDL's own inference code, strategy 'cpu fp32',
no fp16 rescaling) for RWKV-6 and RWKV-7, and `rwkv7-hf` (pure-PyTorch HF model in fla
naming) for RWKV-7. Tolerance: max abs logit difference < 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.support import rwkv_ckpt
from tests.support.rwkv_ckpt import HEAD, HIDDEN, LAYERS, VOCAB, random_ids

import mi_core as mi

TOL = 1e-4


def _rwkv_package_logits(directory: Path, blink: dict, v7: bool, ids: torch.Tensor) -> torch.Tensor:
    """[batch, seq, vocab] from the `rwkv` package, one sequence at a time (it has no batch)."""
    ref = rwkv_ckpt.reference_model(directory, blink, v7, jit=False)  # same math, no compile time
    return torch.stack([ref.forward(row.tolist(), None, full_output=True)[0].float() for row in ids])


def test_rwkv6_logits_match_rwkv_package(v6_model: mi.MIModel, tmp_path: Path) -> None:
    ids = random_ids(2, 37)  # not a multiple of the chunk size
    ours = v6_model.forward(ids).output
    blink = rwkv_ckpt.to_blinkdl_v6(rwkv_ckpt.v6_tensors(LAYERS, HIDDEN, HEAD, VOCAB))
    ref = _rwkv_package_logits(tmp_path, blink, False, ids)
    assert (ours - ref).abs().max().item() < TOL


def test_rwkv7_logits_match_rwkv_package(v7_model: mi.MIModel, tmp_path: Path) -> None:
    ids = random_ids(2, 37, seed=1)
    ours = v7_model.forward(ids).output
    blink = rwkv_ckpt.to_blinkdl_v7(rwkv_ckpt.v7_tensors(LAYERS, HIDDEN, HEAD, VOCAB), LAYERS)
    ref = _rwkv_package_logits(tmp_path, blink, True, ids)
    assert (ours - ref).abs().max().item() < TOL


def test_rwkv7_logits_match_rwkv7_hf(v7_model: mi.MIModel) -> None:
    from rwkv7_hf import RWKV7Config, RWKV7ForCausalLM

    cfg = rwkv_ckpt.v7_config(LAYERS, HIDDEN, HEAD, VOCAB)
    ref = RWKV7ForCausalLM(RWKV7Config(**{k: v for k, v in cfg.items()
                                          if k not in ("model_type", "architectures")}))
    ref.load_state_dict(rwkv_ckpt.v7_tensors(LAYERS, HIDDEN, HEAD, VOCAB), strict=True)
    ref.eval()
    ids = random_ids(1, 12, seed=2)
    with torch.no_grad():
        expected = ref(input_ids=ids, use_cache=False).logits
    assert (v7_model.forward(ids).output - expected).abs().max().item() < TOL
