"""Full attribution graphs against circuit-tracer's `attribute` on the same tiny model + CLT.

Reference: tests/clt/fixtures/attr_ref.* written by scripts/make_clt_fixtures.py with
circuit-tracer 0.5.0 (TransformerLens backend; the tiny LLaMA's weights converted by
TransformerLens' own converter, TL-vs-HF logits agree to 3e-6). Our side runs the same
HF checkpoint through mi-transformer. Tolerance: adjacency 1e-4 absolute on every node
(the brief asks for the kept nodes; we hold the whole matrix to it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import mi_core as mi
from mi_core.serialize import from_json, to_json
from mi_clt.attribution import attribute
from mi_clt.graph import CircuitGraph

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def tiny():
    return mi.MIModel.from_pretrained(FIX / "tiny_llama")


# attr: the CLT reads hook_resid_mid; attr_mlpin: the same weights read the MLP input
# (circuit-tracer's mlp.hook_in = ours: after the ln2 gain), behind the frozen ln2 scale.
@pytest.fixture(scope="module", params=["attr", "attr_mlpin"])
def setup(request, tiny):
    model = tiny
    meta = json.loads((FIX / f"{request.param}_ref.json").read_text())
    clt = mi.load_dictionary(FIX / meta.get("clt", "attr_clt"))
    ref = load_file(str(FIX / f"{request.param}_ref.safetensors"))
    graph = attribute(model, clt, ref["input_tokens"], max_n_logits=meta["max_n_logits"],
                      desired_logit_prob=meta["desired_logit_prob"], batch_size=16)
    return model, clt, ref, meta, graph


def test_nodes_match_circuit_tracer(setup) -> None:
    _, _, ref, _, g = setup
    assert torch.equal(g.active_features, ref["active_features"])
    assert (g.activation_values - ref["activation_values"]).abs().max() < 1e-5
    assert g.logit_tokens == ref["logit_tokens"].tolist()
    assert (g.logit_probabilities - ref["logit_probabilities"]).abs().max() < 1e-6


def test_adjacency_matches_circuit_tracer(setup) -> None:
    _, _, ref, _, g = setup
    assert g.adjacency.shape == ref["adjacency"].shape
    kept = ref["node_mask"]
    sub = lambda a: a[kept][:, kept]  # noqa: E731
    assert (sub(g.adjacency) - sub(ref["adjacency"])).abs().max() < 1e-4
    assert (g.adjacency - ref["adjacency"]).abs().max() < 1e-4
    assert ref["adjacency"].abs().max() > 0.1  # a non-trivial graph


def test_pruning_and_scores_match_circuit_tracer(setup) -> None:
    _, _, ref, meta, g = setup
    res = g.prune(meta["node_threshold"], meta["edge_threshold"])
    assert torch.equal(res.node_mask, ref["node_mask"])
    assert torch.equal(res.edge_mask, ref["edge_mask"])
    assert (res.cumulative_scores - ref["cumulative_scores"]).abs().max() < 1e-5
    replacement, completeness = g.scores()
    assert abs(replacement - meta["replacement_score"]) < 1e-4
    assert abs(completeness - meta["completeness_score"]) < 1e-4


def test_max_feature_nodes_keeps_the_rows_of_the_full_graph(setup) -> None:
    model, clt, ref, meta, full = setup
    g = attribute(model, clt, ref["input_tokens"], max_n_logits=meta["max_n_logits"],
                  desired_logit_prob=meta["desired_logit_prob"], batch_size=16,
                  max_feature_nodes=40)
    assert g.n_features == 40
    # map the selected features back to the full graph's node indices
    sel = [int(((full.active_features == f).all(1)).nonzero()) for f in g.active_features]
    cols = torch.tensor(sel + list(range(full.n_features, full.adjacency.shape[0])))
    assert (g.adjacency[:40] - full.adjacency[sel][:, cols]).abs().max() < 1e-5
    assert (g.adjacency[-g.n_logits:] - full.adjacency[-g.n_logits:][:, cols]).abs().max() < 1e-5


def test_viewer_json_png_and_result_round_trip(setup, tmp_path: Path) -> None:
    _, _, ref, _, g = setup
    out = g.to_viewer_json(tmp_path / "g.json", slug="tiny")
    data = json.loads((tmp_path / "g.json").read_text())
    assert set(data) == {"metadata", "qParams", "nodes", "links"}
    ids = {n["node_id"] for n in data["nodes"]}
    assert all(link["source"] in ids and link["target"] in ids for link in data["links"])
    kinds = {n["feature_type"] for n in data["nodes"]}
    assert {"embedding", "logit", "cross layer transcoder"} <= kinds
    assert len(out["links"]) == int(g.prune().edge_mask.sum()) or len(out["links"]) > 0
    png = g.save_png(tmp_path / "g.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    back = from_json(to_json(g), CircuitGraph)
    assert torch.allclose(back.adjacency, g.adjacency) and back.logit_tokens == g.logit_tokens
