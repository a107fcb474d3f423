"""The data-initialised CLT builder used by the examples and the benchmark."""

from __future__ import annotations

from pathlib import Path

import torch

import mi_core as mi
from mi_core.dictionaries import CltFeatureId
from mi_clt.synthetic import build_clt

FIX = Path(__file__).parent / "fixtures"


def test_build_clt_writes_a_loadable_sparse_clt_with_planted_decoders(tmp_path: Path) -> None:
    model = mi.MIModel.from_pretrained(FIX / "tiny_llama")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 64, (1, 24), generator=g) for _ in range(4)]
    direction = torch.randn(16, generator=g)
    d = build_clt(model, prompts, tmp_path / "clt", d_features=64, n_active=4,
                  planted={(1, 3): direction})
    clt = mi.load_dictionary(d)
    assert (clt.n_layers, clt.d_model, clt.d_features, clt.activation) == (3, 16, 64, "jump_relu")
    acts, _ = clt.encode_model(model, prompts[0])
    per_pos = (acts[:, 1:] != 0).sum(-1).float().mean()
    assert 1.0 <= float(per_pos) <= 12.0  # ~n_active per position and layer
    v = clt.decoder_vectors(CltFeatureId(1, 3))
    cos = torch.nn.functional.cosine_similarity(v, direction.expand_as(v), dim=-1)
    assert (cos > 0.9999).all()
