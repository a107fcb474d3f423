"""Splicing SAEs into a model: reconstruction, error term, injection, suppression, capture.

The model is the hand-made TinyBackend (sae_tiny_backend.py); the references are the
un-spliced run and the SAE's own encode/decode on the captured activations.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_sae import (ReconstructionMetrics, activation_metrics, capture_features, evaluate,
                    top_activating)
from tests.support.sae_tiny_backend import tiny_model, write_saelens_sae

TOL = 1e-5


@pytest.fixture(scope="module")
def model() -> mi.MIModel:
    return tiny_model()


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def resid_sae(tmp_path: Path):
    return mi.load_dictionary(write_saelens_sae(tmp_path / "r", "blocks.0.hook_resid_post", 16, 64))


SAES = {
    "resid": dict(hook="blocks.0.hook_resid_post", d_in=16, d_sae=64),
    "hook_z": dict(hook="blocks.1.attn.hook_z", d_in=16, d_sae=48),
    "transcoder": dict(hook="blocks.0.ln2.hook_normalized", d_in=16, d_sae=40,
                       hook_out="blocks.0.hook_mlp_out", d_out=16, arch="jumprelu_transcoder"),
    "topk_mlp_in": dict(hook="blocks.1.hook_mlp_in", d_in=16, d_sae=64, arch="topk",
                        extra={"k": 4}),
}


@pytest.mark.parametrize("kind", sorted(SAES))
def test_splice_with_error_term_leaves_logits_unchanged(model, ids, tmp_path: Path, kind: str) -> None:
    sae = mi.load_dictionary(write_saelens_sae(tmp_path / kind, **SAES[kind]))
    clean = model(ids).output
    with_err = model(ids, sae.splice(mi.HookSpec(), include_error=True, model=model)).output
    without = model(ids, sae.splice(mi.HookSpec(), model=model)).output
    torch.testing.assert_close(with_err, clean, atol=TOL, rtol=0)
    assert (without - clean).abs().max() > 1e-3  # the reconstruction really replaced it


def test_splice_replaces_activation_with_reconstruction(model, ids, resid_sae) -> None:
    hp = resid_sae.hook_point
    x = model(ids, mi.HookSpec().capture(hp))[hp]
    spliced = model(ids, resid_sae.splice(mi.HookSpec().capture(hp)))[hp]  # capture is after
    torch.testing.assert_close(spliced, resid_sae.decode(resid_sae.encode(x)), atol=TOL, rtol=0)


def test_transcoder_splice_writes_output_hook_from_input_hook(model, ids, tmp_path: Path) -> None:
    sae = mi.load_dictionary(write_saelens_sae(tmp_path / "t", **SAES["transcoder"]))
    spec = mi.HookSpec().capture(sae.hook_point).capture(sae.hook_point_out)
    clean = model(ids, spec)
    spliced = model(ids, sae.splice(spec.copy()))
    torch.testing.assert_close(spliced[sae.hook_point_out], sae.reconstruct(clean[sae.hook_point]),
                               atol=TOL, rtol=0)


def test_feature_edit_with_error_term_changes_only_by_the_edit(model, ids, resid_sae) -> None:
    hp, feat = resid_sae.hook_point, 3
    x = model(ids, mi.HookSpec().capture(hp))[hp]
    f = resid_sae.encode(x)

    def ablate(acts: torch.Tensor) -> torch.Tensor:
        acts = acts.clone()
        acts[..., feat] = 0
        return acts

    out = model(ids, resid_sae.splice(mi.HookSpec().capture(hp), include_error=True,
                                      feature_edit=ablate))[hp]
    expected = x - f[..., feat, None] * resid_sae.W_dec[feat]
    assert f[..., feat].abs().max() > 0
    torch.testing.assert_close(out, expected, atol=TOL, rtol=0)


def test_inject_adds_decoder_direction_only_at_chosen_positions(model, ids, resid_sae) -> None:
    hp = resid_sae.hook_point
    x = model(ids, mi.HookSpec().capture(hp))[hp]
    spec = resid_sae.inject(mi.HookSpec().capture(hp), feature=5, strength=4.0, positions=[2, 7],
                            seq_len=ids.shape[1])
    assert isinstance(spec.interventions_at(hp)[0], mi.Add)
    out = model(ids, spec)[hp]
    delta = out - x
    torch.testing.assert_close(delta[:, 2], (4.0 * resid_sae.W_dec[5]).expand(2, -1), atol=TOL, rtol=0)
    torch.testing.assert_close(delta[:, 7], delta[:, 2], atol=TOL, rtol=0)
    assert delta[:, [0, 1, 3, 4, 5, 6, 8]].abs().max() == 0


def test_inject_into_hook_z_sae_shapes_operand_per_head(model, ids, tmp_path: Path) -> None:
    sae = mi.load_dictionary(write_saelens_sae(tmp_path / "z", **SAES["hook_z"]))
    hp = sae.hook_point
    x = model(ids, mi.HookSpec().capture(hp))[hp]
    out = model(ids, sae.inject(mi.HookSpec().capture(hp), 1, -2.0, d_head=8))[hp]
    torch.testing.assert_close((out - x).reshape(2, 9, 16)[0, 0], -2.0 * sae.W_dec[1], atol=TOL, rtol=0)
    with pytest.raises(mi.DictionaryError, match="d_head"):
        sae.inject(mi.HookSpec(), 1, 1.0)


def test_suppress_removes_the_features_own_contribution(model, ids, resid_sae) -> None:
    hp, feat = resid_sae.hook_point, 3
    x = model(ids, mi.HookSpec().capture(hp))[hp]
    f = resid_sae.encode(x)[..., feat]
    out = model(ids, resid_sae.suppress(mi.HookSpec().capture(hp), feat, positions=[4]))[hp]
    expected = x.clone()
    expected[:, 4] -= f[:, 4, None] * resid_sae.W_dec[feat]
    assert f[:, 4].abs().max() > 0
    torch.testing.assert_close(out, expected, atol=TOL, rtol=0)


def test_capture_features_and_top_activating_positions(model, ids, resid_sae) -> None:
    hp = resid_sae.hook_point
    dense = resid_sae.encode(model(ids, mi.HookSpec().capture(hp))[hp])  # [2, 9, 64]
    cap = capture_features(model, resid_sae, ids, batch_size=1)
    assert cap.tokens == ids.tolist()
    for p in range(2):
        torch.testing.assert_close(cap.sparse(p).to_dense(), dense[p], atol=TOL, rtol=0)
    feat = int(dense.sum((0, 1)).argmax())
    top = top_activating(cap, feat, n=3)
    flat = dense[..., feat].flatten()
    want = torch.topk(flat, 3).indices.tolist()
    assert [(e.prompt * 9 + e.position) for e in top] == want
    assert [e.value for e in top] == pytest.approx(flat[want].tolist(), abs=TOL)


def test_evaluate_reports_metrics_that_round_trip_json(model, ids, resid_sae) -> None:
    m = evaluate(model, resid_sae, ids)
    hp = resid_sae.hook_point
    x = model(ids, mi.HookSpec().capture(hp))[hp]
    x_hat = resid_sae.reconstruct(x)
    assert m.mse == pytest.approx(float((x - x_hat).pow(2).mean()), rel=1e-5)
    ev = 1 - (x - x_hat).pow(2).sum() / (x.reshape(-1, 16) - x.reshape(-1, 16).mean(0)).pow(2).sum()
    assert m.explained_variance == pytest.approx(float(ev), rel=1e-5)
    assert m.l0 == pytest.approx(float((resid_sae.encode(x) != 0).sum(-1).float().mean()))
    assert m.n_tokens == 18
    assert m.ce_loss_increase == pytest.approx(m.ce_loss_spliced - m.ce_loss_clean)
    logits = model(ids, resid_sae.splice(mi.HookSpec())).output
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 32), ids[:, 1:].reshape(-1))
    assert m.ce_loss_spliced == pytest.approx(float(ce), rel=1e-5)
    assert mi.from_json(mi.to_json(m), ReconstructionMetrics) == m


def test_activation_metrics_of_a_perfect_reconstruction(resid_sae) -> None:
    # decode(encode(x)) as input is not a fixed point, but target == output gives mse 0, ev 1
    x = torch.randn(20, 16)
    out = resid_sae.reconstruct(x)
    m = activation_metrics(resid_sae, x, target=out)
    assert m.mse == pytest.approx(0, abs=1e-12) and m.explained_variance == pytest.approx(1.0)
