"""Activation patching (mi_core.interp.act_patching and patching_grid) against TransformerLens'
``transformer_lens.patching`` on the same weights: the tiny LLaMA (grouped-query attention) as
a HookedTransformer (tests.support.tl_hooked). Every kind TransformerLens offers, by position
and over all positions; raw metric values, max abs diff < 1e-4 (F32; measured ~1e-6)."""

from __future__ import annotations

import pytest
import torch

from mi_core.interp import act_patching, attribution_patching, patching_grid

from tests.support.tl_hooked import hooked_llama

tl_patching = pytest.importorskip("transformer_lens.patching")

SEQ = 6
KINDS = [n for n in dir(tl_patching) if n.startswith("get_act_patch_")]


@pytest.fixture(scope="module")
def setup(tiny_llama):
    model = tiny_llama.load()
    ht = hooked_llama(tiny_llama.path, use_attn_result=True)
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(3, 128, (2, SEQ), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(3, 128, (2,), generator=g)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return (logits[:, -1, 5] - logits[:, -1, 9]).mean()

    model.set_use_attn_result(True)  # as TransformerLens: filters then select hook_result
    _, cache = model.run_with_cache(clean, names_filter=lambda n: True)
    assert "blocks.0.attn.hook_result" in cache
    with torch.no_grad():
        _, tl_cache = ht.run_with_cache(clean)
    return model, ht, clean, corrupted, metric, cache, tl_cache


def test_every_transformerlens_patching_function_exists_here():
    missing = [k for k in KINDS if not hasattr(act_patching, k)]
    assert not missing and len(KINDS) >= 18  # transformer-lens 3.x has 18


@pytest.mark.parametrize("name", KINDS)
def test_patching_function_equals_transformerlens(setup, name):
    model, ht, _, corrupted, metric, cache, tl_cache = setup
    got = getattr(act_patching, name)(model, corrupted, cache, metric)
    with torch.no_grad():
        want = getattr(tl_patching, name)(ht, corrupted, tl_cache, metric)
    assert got.shape == want.shape
    assert (got - want.cpu()).abs().max().item() < 1e-4
    assert want.std().item() > 0  # the patches really change the metric


def test_result_patching_equals_patching_z(setup):
    """hook_result (opt-in) patched per head = hook_z patched per head (result = z W_O)."""
    model, _, _, corrupted, metric, cache, _ = setup
    a = act_patching.get_act_patch_attn_head_result_all_pos(model, corrupted, cache, metric)
    b = act_patching.get_act_patch_attn_head_out_all_pos(model, corrupted, cache, metric)
    assert (a - b).abs().max().item() < 1e-4


def test_index_df_and_normalize(setup):
    model, ht, clean, corrupted, metric, cache, tl_cache = setup
    import pandas as pd

    df = pd.DataFrame({"layer": [0, 2, 1], "pos": [2, 5, 2]})
    got = act_patching.get_act_patch_resid_pre(model, corrupted, cache, metric, index_df=df,
                                               index_axis_names=None)
    with torch.no_grad():
        want = tl_patching.get_act_patch_resid_pre(ht, corrupted, tl_cache, metric, index_df=df,
                                                   index_axis_names=None)
    assert (got - want).abs().max().item() < 1e-4
    clean_v = float(metric(model.forward(clean).output))
    corr_v = float(metric(model.forward(corrupted).output))
    norm = act_patching.get_act_patch_resid_pre(model, corrupted, cache, metric,
                                                normalize=(clean_v, corr_v))
    raw = act_patching.get_act_patch_resid_pre(model, corrupted, cache, metric)
    assert (norm - (raw - corr_v) / (clean_v - corr_v)).abs().max().item() < 1e-5
    assert abs(norm[0, 2].item() - 1.0) < 1e-4  # patching the only differing token restores it


@pytest.mark.parametrize("kind,tl_name", [("resid_mid", "get_act_patch_resid_mid"),
                                          ("q", "get_act_patch_attn_head_q_all_pos"),
                                          ("k", "get_act_patch_attn_head_k_all_pos"),
                                          ("pattern", "get_act_patch_attn_head_pattern_all_pos")])
def test_patching_grid_raw_equals_transformerlens(setup, kind, tl_name):
    """patching_grid(raw=True) on one prompt pair = TransformerLens on that pair."""
    model, ht, clean, corrupted, _, _, _ = setup

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 9]

    res = patching_grid(model, clean[:1], corrupted[:1], metric, kind=kind, raw=True)
    with torch.no_grad():
        _, tl_cache = ht.run_with_cache(clean[:1])
        want = getattr(tl_patching, tl_name)(ht, corrupted[:1], tl_cache,
                                             lambda lg: metric(lg).mean())
    assert (res.grid - want).abs().max().item() < 1e-4


def test_attribution_patching_uses_gradients_equal_to_autograd(setup):
    """Its grid = grad . (clean - corrupted) with the gradient of an explicit autograd run."""
    model, _, clean, corrupted, _, _, _ = setup

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 9]

    res = attribution_patching(model, clean[:1], corrupted[:1], metric, kind="resid_pre",
                               raw=True)
    name = "blocks.1.hook_resid_pre"
    c_clean = model.run_with_cache(clean[:1], names_filter=name)[1][name]
    c_corr = model.run_with_cache(corrupted[:1], names_filter=name)[1][name]
    leaf = c_corr.clone().requires_grad_(True)
    out = model.run_with_hooks(corrupted[:1], fwd_hooks=[(name, lambda t, hook: leaf)])
    (g,) = torch.autograd.grad(metric(out).sum(), leaf)
    want = (g * (c_clean - c_corr)).sum(-1)[0] + metric(model.forward(corrupted[:1]).output)
    assert (res.grid[1] - want.detach()).abs().max().item() < 1e-4
