"""Published state-space configs whose keys transformers reads differently from what they
seem to say load and give transformers' numbers (tests/transformer/published_configs/).

- tiiuae/falcon-mamba-7b publishes ``expand: 16`` beside ``intermediate_size: 8192`` (4096
  hidden): transformers 5 builds the 8192-wide mixer (a given intermediate_size overrides
  expand * hidden), so must we; state-spaces/mamba-*-hf repeat the width as ``d_inner``.
- mistralai/Mamba-Codestral-7B-v0.1 publishes ``intermediate_size`` (transformers' Mamba2
  never reads it), ``norm_before_gate: true`` (never read) and, written by transformers 4,
  ``time_step_limit: [0.0, Infinity]`` with a bare ``Infinity`` literal.

- The dense Granite 4.0 configs (granite-4.0-micro, -h-micro) publish
  ``num_experts_per_tok: 0`` beside ``num_local_experts: 0``: transformers builds no router.
- MiniMaxAI/MiniMax-Text-01-hf publishes ``postnorm: true``, ``shared_intermediate_size: 0``,
  ``shared_moe_mode`` and ``rotary_dim``, none read by transformers' MiniMax: accepted at the
  values it implements (``rotary_dim`` = the head width it rotates whole), refused otherwise.

Each is a tiny checkpoint made with transformers with that config shape, compared at F32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch

import mi_core as mi
from tests.support.ssm_tiny import HIDDEN, make_tiny_ssm, ssm_ids

TOL = 1e-4


def _assert_parity(path: Path, hf: torch.nn.Module, kind: str | list[str],
                   point: Callable[[int], mi.HookPoint] = mi.HookPoint.resid_post) -> None:
    """Logits and each layer's residual stream; transformers' hidden_states[i] is our
    resid_post(i) for its Mamba models, resid_pre(i) for the hybrids (embedding first)."""
    model = mi.MIModel.from_pretrained(path)
    ids = ssm_ids(2, 13, seed=3)
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
    L = model.num_layers
    cache = model.forward(ids, mi.HookSpec().capture_all(point(i) for i in range(L)))
    assert (cache.output - ref.logits).abs().max().item() < TOL
    for i in range(L):
        assert (cache[point(i)] - ref.hidden_states[i]).abs().max() < TOL
    assert cache.output.std().item() > 0.5
    assert model.layer_types == ([kind] * L if isinstance(kind, str) else kind)


def _edit(path: Path, **changes: object) -> None:
    cfg_file = path / "config.json"
    cfg = json.loads(cfg_file.read_text()) | changes
    cfg_file.write_text(json.dumps(cfg, indent=2))


def test_falcon_mamba_intermediate_size_overrides_expand_as_in_transformers(tmp_path):
    t = make_tiny_ssm(tmp_path, "falcon_mamba", expand=16, intermediate_size=48)
    assert t.hf.backbone.layers[0].mixer.in_proj.weight.shape == (96, HIDDEN)  # 2 x 48 wide
    _edit(t.path, d_inner=48)  # mamba_ssm's name for the width, as the -hf configs repeat it
    _assert_parity(t.path, t.hf, "mamba")
    assert mi.MIModel.from_pretrained(t.path).num_heads == 48  # one channel per "head"


def test_codestral_shape_with_a_bare_infinity_and_unread_keys_loads(tmp_path):
    t = make_tiny_ssm(tmp_path, "mamba2", norm_before_gate=True)
    cfg_file = t.path / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg |= {"intermediate_size": 2 * HIDDEN, "norm_before_gate": True, "time_step_rank": 256,
            "time_step_limit": [0.0, float("inf")]}
    cfg_file.write_text(json.dumps(cfg))  # Python's json: a bare Infinity, as transformers 4
    assert "Infinity]" in cfg_file.read_text()
    _assert_parity(t.path, t.hf, "mamba2")


def test_nemotron_h_without_time_step_min_clamps_dt_at_transformers_default(tmp_path):
    """nvidia/Nemotron-H-8B-Base-8K's published config (as copied) has no time_step_min:
    transformers clamps dt at its default 0.001. Heads with a very negative dt bias make the
    clamp bite (softplus(-9) ~ 1.2e-4 < 0.001), so a floor of 0 would differ."""
    from tests.support.hybrid_tiny import make_tiny_hybrid

    t = make_tiny_hybrid(tmp_path, "nemotron_h")
    with torch.no_grad():
        for layer in t.hf.model.layers:
            if hasattr(layer.mixer, "dt_bias"):
                layer.mixer.dt_bias[:4] = -9.0
    t.hf.save_pretrained(t.path)
    cfg = json.loads((t.path / "config.json").read_text())
    assert cfg.pop("time_step_min") == 1e-3
    (t.path / "config.json").write_text(json.dumps(cfg))
    model = mi.MIModel.from_pretrained(t.path)
    ids = ssm_ids(2, 13, seed=4)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (model.forward(ids).output - ref).abs().max().item() < TOL


def test_dense_granite_4_with_zero_experts_per_token_loads_with_transformers_numbers(tmp_path):
    from tests.support.hybrid_tiny import HYBRID_LAYER_TYPES, make_tiny_hybrid

    t = make_tiny_hybrid(tmp_path, "granitemoehybrid_dense", num_experts_per_tok=0)
    assert json.loads((t.path / "config.json").read_text())["num_experts_per_tok"] == 0
    assert t.hf.model.layers[0].block_sparse_moe is None  # no router: the shared MLP alone
    _assert_parity(t.path, t.hf, HYBRID_LAYER_TYPES["granitemoehybrid_dense"],
                   mi.HookPoint.resid_pre)


def test_minimax_hf_release_keys_load_at_the_values_transformers_implements(tmp_path):
    from tests.support.zamba2_minimax_tiny import ZM_LAYER_TYPES, make_tiny_zm

    t = make_tiny_zm(tmp_path, "minimax")
    head_dim = json.loads((t.path / "config.json").read_text())["head_dim"]
    _edit(t.path, postnorm=True, shared_intermediate_size=0, shared_moe_mode="sigmoid",
          rotary_dim=head_dim)
    _assert_parity(t.path, t.hf, ZM_LAYER_TYPES["minimax"], mi.HookPoint.resid_pre)
    _edit(t.path, rotary_dim=head_dim // 2)  # the release's 64 of 128: not what is computed
    with pytest.raises(mi.MIError, match=f"rotary_dim = {head_dim // 2}.*{head_dim}"):
        mi.MIModel.from_pretrained(t.path)
