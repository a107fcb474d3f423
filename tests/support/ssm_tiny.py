"""Tiny random state-space checkpoints made with `transformers` (Mamba, Falcon-Mamba, Mamba-2).

Unit scale with the settings released checkpoints use (residual_in_fp32, conv bias, no
projection bias, SiLU, Mamba-2 with groups of heads and its default dt limit): embeddings
N(0, 1); every matrix N(0, 1 / fan_in), so activations stay O(1) through the layers; norm
gains 1 + 0.1 N(0, 1); A_log, D and the dt biases around transformers' initialisation
(A_log = log(1..N) + 0.1 noise, D = 1 + 0.3 noise), so decays are those of a trained
model's range rather than of a degenerate one. Mamba-2's chunk_size (8) is shorter than the
test prompts, so transformers' own chunked scan spans several chunks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import torch

VOCAB, HIDDEN, LAYERS = 64, 32, 2

#: name -> (model_type, config)
SSM_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "mamba": ("mamba", dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                            state_size=8, expand=2, conv_kernel=4, time_step_rank=4,
                            pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "falcon_mamba": ("falcon_mamba", dict(vocab_size=VOCAB, hidden_size=HIDDEN,
                                          num_hidden_layers=LAYERS, state_size=8, expand=2,
                                          conv_kernel=4, mixer_rms_eps=1e-6,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "mamba2": ("mamba2", dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                              state_size=8, expand=2, conv_kernel=4, num_heads=8, head_dim=8,
                              n_groups=2, chunk_size=8, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2)),
}


@attrs.define
class TinySsm:
    """A saved tiny checkpoint and the transformers model it came from (eval, F32)."""

    name: str
    path: Path
    hf: Any


def _randomise(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("A_log"):
                p.add_(0.1 * noise)
            elif name.endswith(".D"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith(("dt_bias", "dt_proj.bias")):
                p.add_(0.3 * noise)
            elif "embed" in name:
                p.copy_(noise)
            elif name.endswith("norm.weight") or "norm_f" in name or "layernorm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif p.dim() == 1:
                p.copy_(0.1 * noise)
            else:  # [out, in] or conv [channels, 1, kernel]
                p.copy_(noise / math.sqrt(p.shape[-1]))


def make_tiny_ssm(root: Path, name: str, seed: int = 0, **overrides: Any) -> TinySsm:
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kwargs = SSM_FAMILIES[name]
    cfg = AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _randomise(hf, seed)
    path = root / name
    hf.save_pretrained(path)
    return TinySsm(name, path, hf)


def ssm_ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """Token ids in [3, VOCAB) (no pad / bos / eos)."""
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
