"""The seed's decoder-projection attribution: scores are W_dec[f -> t] . direction
(checked against the raw decoder files with plain torch)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

import mi_core as mi
from mi_core.dictionaries import CltFeatureId
from mi_clt.attribution import (AttributionGraph, build_attribution_graph,
                                extract_decoder_vectors, score_features_by_decoder_projection)
from mi_core.serialize import from_json, to_json

FIX = Path(__file__).parent / "fixtures"


def _raw_rows(target: int) -> dict[CltFeatureId, torch.Tensor]:
    out = {}
    for src in range(target + 1):
        w = load_file(str(FIX / "clt_relu" / f"W_dec_{src}.safetensors"))[f"W_dec_{src}"]
        for i in range(w.shape[0]):
            out[CltFeatureId(src, i)] = w[i, target - src]
    return out


def test_scores_are_decoder_dot_direction_over_all_source_layers() -> None:
    clt = mi.load_dictionary(FIX / "clt_relu")
    direction = torch.randn(16, generator=torch.Generator().manual_seed(0))
    g = score_features_by_decoder_projection(clt, direction, target_layer=2, chunk=7)
    raw = _raw_rows(2)
    assert len(g) == len(raw) == 96  # 3 source layers x 32 features write to layer 2
    for e in g.edges:
        assert abs(e.score - float(raw[e.source] @ direction)) < 1e-5
    assert all(a.score >= b.score for a, b in zip(g.edges, g.edges[1:]))


def test_top_k_threshold_and_cosine() -> None:
    clt = mi.load_dictionary(FIX / "clt_relu")
    direction = torch.randn(16, generator=torch.Generator().manual_seed(1))
    full = score_features_by_decoder_projection(clt, direction, target_layer=1)
    top = score_features_by_decoder_projection(clt, direction, target_layer=1, top_k=5)
    assert [e.source for e in top.edges] == [e.source for e in full.edges[:5]]
    assert full.top_k(5).edges == top.edges
    thr = full.threshold(0.5)
    assert all(abs(e.score) >= 0.5 for e in thr.edges) and len(thr) < len(full)
    cos = build_attribution_graph(clt, direction, target_layer=1, target="tok", top_k=3)
    raw = _raw_rows(1)
    for e in cos.edges:
        want = torch.nn.functional.cosine_similarity(raw[e.source], direction, dim=0)
        assert abs(e.score - float(want)) < 1e-5 and e.target == "tok"
    assert from_json(to_json(cos), AttributionGraph) == cos


def test_extract_decoder_vectors_stacks_rows_at_the_target_layer() -> None:
    clt = mi.load_dictionary(FIX / "clt_relu")
    feats = [CltFeatureId(0, 1), CltFeatureId(2, 5)]
    v = extract_decoder_vectors(clt, feats, target_layer=2)
    raw = _raw_rows(2)
    assert torch.equal(v, torch.stack([raw[f] for f in feats]))
