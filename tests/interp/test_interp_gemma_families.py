"""Every analysis on Gemma-4 (dense with per-layer inputs and shared keys; MoE beside the MLP
with keys as values) and Gemma-3n (AltUp streams, Laurel): knockout, steering, logit lens,
patching, the TransformerLens layer, process_weights where it applies, and typed refusals where
an analysis's premise does not hold (residual decomposition: these residual streams are not the
sum of the layers' attention and MLP outputs).

Checkpoints: tests/support/tiny_families_gemma.py (transformers, random unit-scale weights).
Sums and unchanged logits are checked to 1e-4 (F32).
"""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    KnockoutSpec, LogitLensAnalysis, SteeringSpec, apply_steering, direct_logit_attribution,
    knockout_hooks, logit_diff_metric, patching_grid, run_for_decomposition, run_knockout,
)
from tests.support.tiny_families_gemma import cached_gemma

NAMES = ["gemma4_text", "gemma4_moe", "gemma3n_text"]


@pytest.fixture(scope="module")
def model_of(tmp_path_factory):
    get = cached_gemma(tmp_path_factory)
    models: dict[str, mi.MIModel] = {}

    def load(name: str) -> mi.MIModel:
        if name not in models:
            models[name] = mi.MIModel.from_pretrained(get(name).path)
        return models[name]

    return load


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", NAMES)
def test_decomposition_and_dla_refuse_naming_why(model_of, ids, name):
    """The residual is not embed + sum(attn_out + mlp_out): layer scalars and per-layer
    inputs (Gemma-4), AltUp's streams and Laurel (Gemma-3n). A CapabilityError says which,
    for the interp functions and the TransformerLens cache's decompositions alike."""
    model = model_of(name)
    why = "AltUp" if name.startswith("gemma3n") else "layer_scalar"
    with pytest.raises(mi.CapabilityError, match=why):
        run_for_decomposition(model, ids)
    with pytest.raises(mi.CapabilityError, match=why):
        direct_logit_attribution(model, ids, token=5)
    _, cache = model.run_with_cache(ids)
    with pytest.raises(mi.CapabilityError, match="decompose_resid"):
        cache.decompose_resid()
    acc = cache.accumulated_resid()  # the residual stream itself is still there to stack
    assert acc.shape[0] == model.num_layers + 1


@pytest.mark.parametrize("name", NAMES)
def test_logit_lens_runs_and_reads_the_final_residual(model_of, ids, name):
    """Gemma-4: the last layer's lens is the output. Gemma-3n: the lens reads the active
    stream (hook_resid_post), while the output averages every AltUp stream (altup.hook_out):
    the lens of altup.hook_out is the output, the last layer's active stream alone is not."""
    model = model_of(name)
    lens = LogitLensAnalysis(k=3).run(model, ids)
    out = model.forward(ids).output[0, -1]
    top = [t.token_id for t in lens.points[-1].top]
    if name.startswith("gemma4"):
        assert top == out.topk(3).indices.tolist()
    else:
        assert len(lens.points) == model.num_layers and len(top) == 3
        final = model.forward(ids, mi.HookSpec().capture("altup.hook_out"))["altup.hook_out"]
        torch.testing.assert_close(model.backend.project_to_vocab(final)[0, -1], out,
                                   atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_knockout_and_steering(model_of, ids, name):
    """Knocking out every key leaves finite logits; on a layer that reads an earlier layer's
    keys (gemma4_text / gemma3n_text layer 2) too; steering an edge to 0 equals knocking it
    out."""
    model = model_of(name)
    out = model.forward(ids, knockout_hooks(model, KnockoutSpec(from_positions=[-1]),
                                            ids.shape[1])).output
    assert torch.isfinite(out).all()
    layer = 2 if model.config.shares_kv(model.num_layers - 1) else 1
    ko = run_knockout(model, ids, KnockoutSpec(layers=[layer], from_positions=[-1],
                                               to_positions=[0, 2]))
    st = apply_steering(model, ids, SteeringSpec.attention([layer], [0, 2], [-1], scale=0.0))
    assert (ko.ablated_logits - model.forward(ids).output).abs().max().item() > 1e-4
    assert (st.steered_logits - ko.ablated_logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_activation_patching(model_of, ids, name):
    """Patching the clean resid_pre of layer 0 into the corrupted run restores the clean
    metric where the residual stream is the model's only state (gemma4_moe); with per-layer
    inputs (read from the ids at every layer) or AltUp's other streams it cannot fully, and
    the grid says so (finite, not 1). Per-head z patching runs on every family."""
    model = model_of(name)
    corr = ids.clone()
    corr[0, 2] = (corr[0, 2] + 7) % 128
    metric = logit_diff_metric(5, 6)
    grid = patching_grid(model, ids, corr, metric, "resid_pre", layers=[0], positions=[2])
    value = grid.grid[0, 0].item()
    if name == "gemma4_moe":
        assert value == pytest.approx(1.0, abs=1e-4)
    else:
        assert torch.isfinite(grid.grid).all() and abs(value - 1.0) > 1e-4
    z = patching_grid(model, ids, corr, metric, "z", layers=[2])
    assert z.grid.shape == (1, model.num_heads) and torch.isfinite(z.grid).all()


def test_transformerlens_layer_on_each_family(model_of, ids):
    g4 = model_of("gemma4_text")
    logits, cache = g4.run_with_cache(ids)
    torch.testing.assert_close(logits, g4.forward(ids).output)
    assert cache["blocks.1.hook_per_layer_input"].shape == (1, 9, 8)
    assert cache["blocks.1.attn.hook_q"].shape == (1, 9, 4, 32)  # full layers: head size 32
    assert "blocks.2.attn.hook_k" not in cache  # shared keys
    one = cache.apply_slice_to_batch_dim(0)
    assert one["blocks.0.hook_resid_pre"].shape == (9, 64)
    with pytest.raises(mi.MIError, match="different shapes"):  # head sizes per layer
        g4.W_Q
    assert g4.tl_weight("W_Q", 1).shape == (4, 64, 32)
    n = model_of("gemma3n_text")
    _, cache = n.run_with_cache(ids, names_filter=lambda p: "altup" in p)
    assert cache["blocks.0.altup.hook_streams_pre"].shape == (1, 9, 3, 64)
    assert cache["altup.hook_out"].shape == (1, 9, 64)
    with pytest.raises(mi.MIError, match="different shapes"):  # MLP widths per layer
        n.W_out
    moe = model_of("gemma4_moe")
    _, cache = moe.run_with_cache(ids, names_filter=lambda p: "mlp.hook_" in p)
    assert cache["blocks.0.mlp.hook_expert_indices"].shape == (1, 9, 2)
    assert cache["blocks.0.mlp.hook_post"].shape == (1, 9, 96)  # the dense MLP beside


def test_process_weights_folds_gemma4_norms_and_refuses_the_rest(tmp_path_factory, ids):
    """Gemma-4 dense: ln1 / ln2 / ln_final folded (shared layers: W_Q only; values follow W_K
    where they are the keys), logits unchanged. Refused: fold_ln with an MoE (gemma4_moe) or
    Laurel (Gemma-3n), fold_value_biases with value norms and biases."""
    get = cached_gemma(tmp_path_factory)
    dense = mi.MIModel.from_pretrained(get("gemma4_text").path)
    before = dense.forward(ids).output
    dense.process_weights(center_unembed=False)
    assert (dense.forward(ids).output - before).abs().max().item() < 1e-4
    gain = dense.backend.w.layers[0].ln1.gain
    assert torch.equal(gain, torch.ones_like(gain))
    with pytest.raises(mi.MIError, match="mixture-of-experts"):
        mi.MIModel.from_pretrained(get("gemma4_moe").path).process_weights()
    with pytest.raises(mi.MIError, match="Laurel"):
        mi.MIModel.from_pretrained(get("gemma3n_text").path).process_weights()
    n = mi.MIModel.from_pretrained(get("gemma3n_text").path)
    before = n.forward(ids).output
    n.process_weights(fold_ln=False, center_writing_weights=False, center_unembed=False)
    assert (n.forward(ids).output - before).abs().max().item() < 1e-4
