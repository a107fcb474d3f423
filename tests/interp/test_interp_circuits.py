"""FactoredMatrix against dense linear algebra; QK/OV circuits and composition scores against
their definitions on dense matrices; head detection on constructed patterns."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    FactoredMatrix, HeadDetectionResult, composition_scores, detect_heads, detection_pattern,
    head_scores, ov_circuit, qk_circuit, repeated_random_tokens,
)
from mi_core.serialize import from_json, to_json


@pytest.fixture
def fm():
    g = torch.Generator().manual_seed(0)
    return FactoredMatrix(torch.randn(3, 20, 4, generator=g, dtype=torch.float64),
                          torch.randn(3, 4, 20, generator=g, dtype=torch.float64))


def test_factored_svd_matches_dense(fm):
    # TransformerLens' convention: V, not its transpose (U @ diag(S) @ V.T == AB)
    U, S, V = fm.svd()
    assert U.shape == (3, 20, 4) and S.shape == (3, 4) and V.shape == (3, 20, 4)
    dense_s = torch.linalg.svdvals(fm.AB)[:, :4]
    torch.testing.assert_close(S, dense_s, atol=1e-10, rtol=0)
    torch.testing.assert_close(U @ torch.diag_embed(S) @ V.transpose(-1, -2), fm.AB, atol=1e-10,
                               rtol=0)
    torch.testing.assert_close(fm.norm(), torch.linalg.matrix_norm(fm.AB), atol=1e-10, rtol=0)


def test_factored_eigenvalues_are_the_nonzero_eigenvalues_of_ab(fm):
    ev = fm.eigenvalues  # a property, as in TransformerLens
    dense = torch.linalg.eigvals(fm.AB)
    for b in range(3):
        big = dense[b][dense[b].abs() > 1e-8]
        got = sorted(ev[b].tolist(), key=lambda z: (round(z.real, 6), round(z.imag, 6)))
        want = sorted(big.tolist(), key=lambda z: (round(z.real, 6), round(z.imag, 6)))
        assert len(got) == len(want) == 4
        for x, y in zip(got, want):
            assert abs(x - y) < 1e-8


def test_factored_products_transpose_and_corner(fm):
    other = torch.randn(20, 5, dtype=torch.float64)
    torch.testing.assert_close((fm @ other).AB, fm.AB @ other)
    torch.testing.assert_close((other.T @ fm).AB, other.T @ fm.AB)
    torch.testing.assert_close((fm @ fm.T).AB, fm.AB @ fm.AB.transpose(-1, -2))
    torch.testing.assert_close(fm.T.AB, fm.AB.transpose(-1, -2))
    # TransformerLens' get_corner cuts every dimension, the batch one too
    torch.testing.assert_close(fm.get_corner(2), fm.AB[:2, :2, :2])
    assert fm.shape == (3, 20, 20)
    with pytest.raises(mi.MIError, match="inner dimensions"):
        FactoredMatrix(torch.zeros(3, 4), torch.zeros(5, 3))


def test_qk_and_ov_circuits_are_the_weight_products(model):
    be = model.backend
    qk = qk_circuit(model, 1)
    # head 3 uses kv head 1 (4 query heads, 2 kv heads)
    torch.testing.assert_close(qk.AB[3], be.layers[1]["W_Q"][3] @ be.layers[1]["W_K"][1].T)
    ov = ov_circuit(model, 2, heads=[0])
    torch.testing.assert_close(ov.AB[0], be.layers[2]["W_V"][0] @ be.layers[2]["W_O"][0])
    folded = qk_circuit(model, 0, heads=[0], fold_ln=True)
    w = be.layers[0]["ln1.w"]
    torch.testing.assert_close(folded.AB[0], (w[:, None] * be.layers[0]["W_Q"][0]) @ (w[:, None] * be.layers[0]["W_K"][0]).T)
    with pytest.raises(mi.InterventionError, match="head 4 out of range"):
        qk_circuit(model, 0, heads=[4])


@pytest.mark.parametrize("kind", ["q", "k", "v"])
def test_composition_scores_match_the_dense_definition(model, kind):
    s = composition_scores(model, kind).scores
    assert s.shape == (3, 4, 3, 4)
    assert (s[1, :, 0] == 0).all() and (s[1, :, 1] == 0).all()  # only earlier -> later
    ov0 = ov_circuit(model, 0).AB[2].double()
    right = {"q": qk_circuit(model, 2).AB[1], "k": qk_circuit(model, 2).AB[1].T,
             "v": ov_circuit(model, 2).AB[1]}[kind].double()
    want = torch.linalg.matrix_norm(ov0 @ right) / (torch.linalg.matrix_norm(ov0) * torch.linalg.matrix_norm(right))
    assert float(s[0, 2, 2, 1]) == pytest.approx(float(want), rel=1e-4)


def test_detection_patterns_on_a_repeated_sequence():
    toks = torch.tensor([0, 5, 6, 7, 5, 6, 7])
    prev = detection_pattern("previous_token", toks)
    assert prev[3, 2] and prev.sum() == 6
    dup = detection_pattern("duplicate_token", toks)
    assert dup[4, 1] and dup[6, 3] and dup.sum() == 3
    ind = detection_pattern("induction", toks)
    assert ind[4, 2] and ind[5, 3] and ind[6, 4] is not None and ind.sum() == 3
    assert not ind[4, 5]
    with pytest.raises(mi.MIError, match="unknown head kind"):
        detection_pattern("copy", toks)


def test_head_scores_are_one_for_the_ideal_pattern_and_zero_for_another():
    toks = torch.tensor([0, 5, 6, 7, 5, 6, 7])
    ideal = detection_pattern("induction", toks).float()
    rows = ideal.sum(-1, keepdim=True).clamp_min(1)
    perfect = (ideal / rows)
    perfect[ideal.sum(-1) == 0, 0] = 1.0  # other rows: attend to BOS
    prev = detection_pattern("previous_token", toks).float()
    prev[0, 0] = 1.0
    pat = torch.stack([perfect, prev])[None]  # [1, 2 heads, q, k]
    s = head_scores(pat, ideal.bool()[None])
    assert float(s[0]) == pytest.approx(1.0) and float(s[1]) == pytest.approx(0.0)


def test_detect_heads_on_the_fake_model(model):
    ids = repeated_random_tokens(model, length=6, batch=2, low=10)
    assert ids.shape == (2, 13) and (ids[:, 1:7] == ids[:, 7:]).all() and (ids[:, 0] == 0).all()
    r = detect_heads(model, ids)
    for kind in ("previous_token", "duplicate_token", "induction"):
        assert r.scores[kind].shape == (3, 4)
        assert ((r.scores[kind] >= 0) & (r.scores[kind] <= 1 + 1e-6)).all()
    # reference for one head: the mean attention on the ideal edges, from the captured pattern
    pat = model.forward(ids, mi.HookSpec().capture("blocks.1.attn.hook_pattern"))["blocks.1.attn.hook_pattern"]
    ideal = torch.stack([detection_pattern("previous_token", row) for row in ids])
    rows = ideal.any(-1)
    want = (pat[:, 2] * ideal).sum(-1)[rows].mean()
    assert float(r.scores["previous_token"][1, 2]) == pytest.approx(float(want), abs=1e-6)
    back = from_json(to_json(r), HeadDetectionResult)
    torch.testing.assert_close(back.scores["induction"], r.scores["induction"])
    assert len(r.top("induction", 3)) == 3


def test_detect_heads_needs_attention_pattern(rwkv_like):
    with pytest.raises(mi.HookError, match="hook_pattern"):
        detect_heads(rwkv_like)


def test_detect_heads_on_a_hybrid_scores_its_attention_layers_and_names_a_recurrent_one():
    """Default layers on a hybrid: its attention layers only; the recurrent layers are NaN and
    never listed by top / heads_above. Asking for a recurrent layer is a typed refusal naming
    it (tests/support/hybrid_tiny.py: jamba's layer 2 is its only attention layer)."""
    from mi_core.interp import detect_heads
    from tests.support.hybrid_tiny import HYBRID_LAYER_TYPES, hybrid_model

    model = hybrid_model("jamba")
    attn = [i for i, t in enumerate(HYBRID_LAYER_TYPES["jamba"]) if t == "full_attention"]
    ids = torch.randint(0, model.vocab_size, (2, 12))
    res = detect_heads(model, ids, show_progress=False)
    for kind, s in res.scores.items():
        scored = s.isfinite().all(-1)
        assert scored.nonzero().flatten().tolist() == attn, kind
        assert {layer for layer, _, _ in res.top(kind, k=s.numel())} == set(attn)
        assert {layer for layer, _, _ in res.heads_above(kind, -1.0)} == set(attn)
    with pytest.raises(mi.HookError, match=r"blocks\.0\.attn\.hook_pattern.*layer 0 is a"):
        detect_heads(model, ids, layers=[0, attn[0]])
