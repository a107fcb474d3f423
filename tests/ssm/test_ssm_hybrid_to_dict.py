"""What transformers writes loads, for the hybrid and linear-attention families: every
attribute transformers' config has (``to_dict()`` with defaults, through its own JSON writer),
beside the same safetensors, gives transformers' logits. (``save_pretrained``'s own
config.json is what every parity test in tests/ssm loads.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mi_core as mi
from tests.support.hybrid_tiny import HYBRID_FAMILIES, tiny_hybrid
from tests.support.linear_tiny import LINEAR_FAMILIES, tiny_linear  # noqa: F401

#: F32 logits; the gated-DeltaNet families' bound is transformers' own F32 error against
#: float64 (docs/DEVIATIONS.md: up to 1.1e-4), doubled
_TOL = {"hybrid": 1e-4, "linear": 2e-4}
_CASES = [("hybrid", n) for n in sorted(HYBRID_FAMILIES) if n != "granitemoehybrid_dense"] + [
    ("linear", n) for n in sorted(LINEAR_FAMILIES)]


@pytest.mark.parametrize("kind,name", _CASES, ids=[n for _, n in _CASES])
def test_the_config_transformers_to_dict_gives_loads_with_transformers_numbers(
        kind, name, tiny_linear, tmp_path: Path) -> None:  # noqa: F811
    t = tiny_hybrid(name) if kind == "hybrid" else tiny_linear(name)
    text = t.hf.config.to_json_string(use_diff=False)
    assert len(json.loads(text)) > len(json.loads((t.path / "config.json").read_text()))
    d = tmp_path / "to_dict"
    d.mkdir()
    (d / "config.json").write_text(text)
    for f in t.path.glob("*.safetensors"):
        (d / f.name).symlink_to(f)
    vocab = t.hf.config.get_text_config().vocab_size  # a wrapper: its text config
    ids = torch.randint(3, vocab, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = t.hf(ids).logits
    got = mi.MIModel.from_pretrained(d).forward(ids).output
    assert (got - want).abs().max().item() < _TOL[kind]
