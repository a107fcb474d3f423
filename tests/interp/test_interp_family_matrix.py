"""Every family of the 2025-26 wave × every analysis, through the public API only (an
acceptance matrix: one cell per family and analysis, so a cell that crashes, silently does
nothing or gives wrong numbers shows): knockout, steering, logit lens, patching, residual
decomposition and direct logit attribution, the TransformerLens layer (the cache's methods and
`mi_core.tl.HookedTransformer`), `process_weights` (each flag alone: the logits keep their
softmax, or a typed refusal), the families' own hook points, left padding and KV-cached greedy
generation.

Families: gpt-oss, OLMo-3, EXAONE-4, DeepSeek-V2 (and V2-Lite) and V3, Llama-4 text, GLM,
GLM-4, GLM-4.5 (glm4_moe), ERNIE-4.5 dense and MoE, Hunyuan dense, Seed-OSS, Apertus, Gemma-3n
text, Gemma-4 text dense and MoE. Checkpoints: the tiny random ones of
tests/support/tiny_families_recent.py, tiny_families_moe2.py and tiny_families_gemma.py
(transformers, unit-scale weights, eager attention, F32), built once per session.

Tolerances: sums and restored patching metrics to 1e-4 (F32 rounding of unit-scale
activations); "changes the output" means > 1e-4 (measured effects are 1e-2 .. 1).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    KnockoutSpec, LogitLensAnalysis, SteeringSpec, apply_steering, decompose_resid,
    direct_logit_attribution, knockout_hooks, logit_diff_metric, patching_grid,
    run_for_decomposition, run_knockout, stack_head_results,
)

#: family -> builder ("recent", "moe2", "gemma")
FAMILIES: dict[str, str] = {
    "gpt_oss": "moe2", "olmo3": "recent", "exaone4": "recent", "deepseek_v2": "moe2",
    "deepseek_v2_lite": "moe2", "deepseek_v3": "moe2", "llama4_text": "moe2", "glm": "recent",
    "glm4": "recent", "glm4_moe": "recent", "ernie4_5": "recent", "ernie4_5_moe": "recent",
    "hunyuan_v1_dense": "recent", "seed_oss": "recent", "apertus": "recent",
    "gemma3n_text": "gemma", "gemma4_text": "gemma", "gemma4_moe": "gemma",
}
NAMES = list(FAMILIES)
SEQ = 9
_BUILT: dict[str, Any] = {}
_MODELS: dict[str, mi.MIModel] = {}


def _build(root: Path, name: str) -> Any:
    kind = FAMILIES[name]
    if kind == "moe2":
        from tests.support.tiny_families_moe2 import make_moe2
        return make_moe2(root, name)
    if kind == "gemma":
        from tests.support.tiny_families_gemma import make_gemma
        return make_gemma(root, name)
    from tests.support.tiny_families_recent import RECENT_FAMILIES
    from tests.transformer.conftest import make_tiny
    model_type, overrides = RECENT_FAMILIES[name]
    return make_tiny(root, name, model_type, overrides)


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Any]:
    root = tmp_path_factory.mktemp("family_matrix21")

    def get(name: str) -> Any:
        if name not in _BUILT:
            _BUILT[name] = _build(root, name)
        return _BUILT[name]

    return get


@pytest.fixture(scope="session")
def family_model(built) -> Callable[[str], mi.MIModel]:
    def get(name: str) -> mi.MIModel:
        if name not in _MODELS:
            _MODELS[name] = mi.MIModel.from_pretrained(built(name).path)
        return _MODELS[name]

    return get


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def ids_for(batch: int = 1, seq: int = SEQ, seed: int = 0) -> torch.Tensor:
    """Token ids in [3, 128) (the tiny vocabularies have 128; no pad / bos / eos)."""
    return torch.randint(3, 128, (batch, seq), generator=torch.Generator().manual_seed(seed))


def points_of(model: mi.MIModel) -> list[str]:
    return [p.name for p in model.hook_points()]


# --------------------------------------------------------------------------- hook points


@pytest.mark.parametrize("name", NAMES)
def test_standard_and_family_hook_points_with_their_shapes(family_model, name):
    model = family_model(name)
    pts = points_of(model)
    b, s = 2, 6
    cache = model.forward(ids_for(b, s, seed=1), mi.HookSpec().capture_all(pts))
    d, L = model.hidden_size, model.num_layers
    assert cache["hook_embed"].shape == (b, s, d)
    assert cache["ln_final.hook_normalized"].shape == (b, s, d)
    assert len(model.layer_types) == L
    for i in range(L):
        for p in ("hook_resid_pre", "hook_resid_post", "attn.hook_q", "attn.hook_attn_scores",
                  "attn.hook_pattern", "attn.hook_z", "hook_attn_out", "hook_mlp_out"):
            assert f"blocks.{i}.{p}" in pts, (i, p)
        # keys and values: every layer but those reading an earlier layer's (Gemma-3n / 4's
        # last num_kv_shared_layers = 2); a pre-norm's points where there is one (OLMo-3
        # and EXAONE-4 have post-norms only)
        shared = name in ("gemma3n_text", "gemma4_text") and i >= L - 2
        assert (f"blocks.{i}.attn.hook_k" in pts) != shared, i
        assert (f"blocks.{i}.attn.hook_v" in pts) != shared, i
        assert (f"blocks.{i}.ln1.hook_scale" in pts) == (name not in ("olmo3", "exaone4")), i
        pat = cache[f"blocks.{i}.attn.hook_pattern"]
        assert pat.shape == (b, model.num_heads, s, s)
        assert (pat.triu(1) == 0).all()  # causal
        z = cache[f"blocks.{i}.attn.hook_z"]
        assert z.shape[:3] == (b, s, model.num_heads)
        assert cache[f"blocks.{i}.hook_resid_post"].shape == (b, s, d)
    cfg = model.config
    if name == "gpt_oss":
        for i in range(L):
            assert cache[f"blocks.{i}.attn.hook_sinks"].shape == (model.num_heads,)
    if name.startswith("deepseek"):
        for i in range(L):
            kv = cache[f"blocks.{i}.attn.hook_kv_latent"]
            assert kv.shape == (b, s, 16)  # kv_lora_rank (tiny_families_moe2._MLA)
            has_q = f"blocks.{i}.attn.hook_q_latent" in pts
            assert has_q == (name != "deepseek_v2_lite"), i  # V2-Lite: no q latent
            if has_q:
                assert cache[f"blocks.{i}.attn.hook_q_latent"].shape == (b, s, 24)
    del cfg


@pytest.mark.parametrize("name", NAMES)
def test_unknown_points_and_layers_raise_before_compute(family_model, name):
    model = family_model(name)
    ids = ids_for()
    with pytest.raises(mi.HookError):
        model.forward(ids, mi.HookSpec().capture(f"blocks.{model.num_layers}.hook_resid_pre"))
    with pytest.raises(mi.HookError):
        model.forward(ids, mi.HookSpec().intervene("blocks.0.ssm.hook_state", mi.Zero()))
    if name != "gpt_oss":  # only gpt-oss has sinks; only MLA has latents
        with pytest.raises(mi.HookError):
            model.forward(ids, mi.HookSpec().capture("blocks.0.attn.hook_sinks"))
    if not name.startswith("deepseek"):
        with pytest.raises(mi.HookError):
            model.forward(ids, mi.HookSpec().capture("blocks.0.attn.hook_kv_latent"))


@pytest.mark.parametrize("name", NAMES)
def test_an_intervention_at_each_family_point_acts(family_model, name):
    """Noise added at every layer's q, k, v, z, pattern, MLP and the family's own points
    (sinks, latents) changes the output: no point is offered but ignored."""
    model = family_model(name)
    ids = ids_for(seed=2)
    plain = model.forward(ids).output
    pts = set(points_of(model))
    for i in range(model.num_layers):
        for p in ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z",
                  "attn.hook_pattern", "attn.hook_sinks", "attn.hook_q_latent",
                  "attn.hook_kv_latent", "attn.hook_rot_q", "attn.hook_rot_k",
                  "mlp.hook_post", "hook_attn_out", "hook_mlp_out"):
            point = f"blocks.{i}.{p}"
            if point not in pts:
                continue
            # noise, not a scale: norms after some points (OLMo-3's post-norms, Gemma's
            # value norm) make a scale invisible downstream
            g = torch.Generator().manual_seed(i)
            hooks = mi.HookSpec().intervene(
                point, lambda t, hook, g=g: t + torch.randn(t.shape, generator=g).to(t.dtype))
            out = model.forward(ids, hooks).output
            assert (out - plain).abs().max().item() > 1e-5, point


# --------------------------------------------------------------------------- analyses


@pytest.mark.parametrize("name", NAMES)
def test_knockout_changes_the_output_and_leaves_earlier_queries(family_model, name):
    model = family_model(name)
    ids = ids_for(seed=3)
    plain = model.forward(ids).output
    ko = run_knockout(model, ids, KnockoutSpec(layers=list(range(model.num_layers)))
                      .edge(-1, SEQ - 2).edge(-1, SEQ - 3))  # inside every window (5)
    assert (ko.baseline_logits - plain[0, -1]).abs().max().item() < 1e-4
    assert (ko.ablated_logits - ko.baseline_logits).abs().max().item() > 1e-4
    hooks = knockout_hooks(model, KnockoutSpec(layers=[0], from_positions=[-1],
                                               to_positions=[0, 1]), SEQ)
    out = model.forward(ids, hooks).output
    assert (out - plain)[:, :-1].abs().max().item() < 1e-4  # earlier queries untouched
    assert torch.isfinite(out).all()
    with pytest.raises(mi.HookError):
        knockout_hooks(model, KnockoutSpec(layers=[model.num_layers]).edge(-1, 0), SEQ)


@pytest.mark.parametrize("name", NAMES)
def test_attention_and_residual_steering(family_model, name):
    model = family_model(name)
    ids = ids_for(seed=4)
    r = apply_steering(model, ids, SteeringSpec.attention([0], to_positions=[SEQ - 2],
                                                          scale=4.0))
    assert r.steered_attention > r.baseline_attention
    assert (r.steered_logits - r.baseline_logits).abs().max().item() > 1e-4
    d = torch.randn(model.hidden_size, generator=torch.Generator().manual_seed(0))
    r = apply_steering(model, ids, SteeringSpec.residual([1], d, strength=3.0))
    assert (r.steered_logits - r.baseline_logits).abs().max().item() > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_logit_lens_and_patching(family_model, name):
    model = family_model(name)
    ids = ids_for(seed=5)
    out = model.forward(ids).output[0, -1]
    lens = LogitLensAnalysis(k=3).run(model, ids)
    assert len(lens.points) == model.num_layers
    # Gemma-3n's output averages its AltUp streams; the lens reads the active one
    # (docs/DEVIATIONS.md), so neither the last lens nor the last residual is the output
    alt = name == "gemma3n_text"
    if not alt:
        assert [t.token_id for t in lens.points[-1].top] == out.topk(3).indices.tolist()
    corrupt = ids.clone()
    corrupt[0, 2] = 3 + (int(corrupt[0, 2]) + 7) % 125
    metric = logit_diff_metric(int(out.argmax()), int(out.argmin()))
    last = model.num_layers - 1
    g = patching_grid(model, ids, corrupt, metric, "resid_post", layers=[last],
                      positions=[0, -1], show_progress=False)
    assert alt or abs(float(g.grid[0, 1]) - 1.0) < 1e-4
    assert abs(float(g.grid[0, 0])) < 1e-3
    g = patching_grid(model, ids, corrupt, metric, "resid_pre", layers=[1], show_progress=False)
    assert g.grid[0, :2].abs().max().item() < 1e-3 and g.grid[0, 2].abs().item() > 1e-3
    z = patching_grid(model, ids, corrupt, metric, "z", layers=[last], show_progress=False)
    assert z.grid.shape == (1, model.num_heads) and torch.isfinite(z.grid).all()
    assert z.grid.abs().max().item() > 1e-4
    # keys by KV head over every layer (Gemma-4's full layers have fewer KV heads: NaN in the
    # columns of heads a layer does not have); the gradient estimate has the same cells
    from mi_core.interp import attribution_patching

    own = [i for i in range(model.num_layers)  # (not the layers reading earlier KV)
           if f"blocks.{i}.attn.hook_k" in points_of(model)]
    k = patching_grid(model, ids, corrupt, metric, "k", layers=own, show_progress=False)
    assert k.grid.shape[0] == len(own) and k.grid.shape[1] >= 1
    assert torch.isfinite(k.grid[:, 0]).all()
    kk = attribution_patching(model, ids, corrupt, metric, "k", layers=own)
    assert torch.equal(kk.grid.isnan(), k.grid.isnan())


@pytest.mark.parametrize("name", NAMES)
def test_decomposition_and_direct_logit_attribution_sum_back_or_refuse(family_model, name):
    model = family_model(name)
    ids = ids_for(seed=6)
    try:
        cache = run_for_decomposition(model, ids, heads=True)
    except mi.CapabilityError as e:  # a residual stream that is not a sum (Gemma-3n's AltUp)
        assert "residual" in str(e)
        with pytest.raises(mi.CapabilityError):
            direct_logit_attribution(model, ids, token=5, incorrect=6)
        return
    stack, labels = decompose_resid(cache, model.num_layers)
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    assert (stack.sum(0) - final).abs().max().item() < 1e-4
    assert labels[0] == "embed" and len(labels) == 1 + 2 * model.num_layers
    out = model.forward(ids).output[0, -1]
    r = direct_logit_attribution(model, ids, token=5, incorrect=6)
    assert r.total == pytest.approx(float(out[5] - out[6]), abs=1e-4)
    assert sum(r.values) + r.remainder == pytest.approx(r.total, abs=1e-4)
    # per head: the heads' results sum to each layer's attention output, or (a norm on the
    # attention output: OLMo-3, EXAONE-4, GLM-4, Gemma) a typed refusal, never a remainder
    # that silently absorbs the difference
    post_norm = name in ("olmo3", "exaone4", "glm4", "gemma4_text", "gemma4_moe")
    if post_norm:
        with pytest.raises(mi.CapabilityError, match="post-norm"):
            stack_head_results(model, cache, layers=[0])
        with pytest.raises(mi.CapabilityError, match="post-norm"):
            direct_logit_attribution(model, ids, token=5, incorrect=6, per_head=True)
        return
    for layer in range(model.num_layers):
        heads, _ = stack_head_results(model, cache, layers=[layer])
        assert (heads.sum(0) - cache[mi.HookPoint.attn_out(layer)]).abs().max().item() < 1e-4
    r = direct_logit_attribution(model, ids, token=5, incorrect=6, per_head=True)
    assert r.total == pytest.approx(float(out[5] - out[6]), abs=1e-4)
    assert sum(r.values) + r.remainder == pytest.approx(r.total, abs=1e-4)


# --------------------------------------------------------------------------- TransformerLens


@pytest.mark.parametrize("name", NAMES)
def test_the_transformerlens_cache_methods(family_model, name):
    model = family_model(name)
    ids = ids_for(seed=7)
    logits, cache = model.run_with_cache(ids)
    assert (logits - model.forward(ids).output).abs().max().item() < 1e-4
    L = model.num_layers
    acc = cache.accumulated_resid()
    assert acc.shape == (L + 1, 1, SEQ, model.hidden_size)
    assert cache["pattern", 0].shape == (1, model.num_heads, SEQ, SEQ)
    assert cache["resid_pre", 1].shape == (1, SEQ, model.hidden_size)
    try:
        stack = cache.decompose_resid()
    except mi.CapabilityError:
        return
    final = cache[f"blocks.{L - 1}.hook_resid_post"]
    assert (stack.sum(0) - final).abs().max().item() < 1e-4
    try:
        heads = cache.stack_head_results(layer=1)
    except mi.MIError:  # W_O of per-layer head sizes (Gemma-4): a typed refusal
        return
    assert heads.shape == (model.num_heads, 1, SEQ, model.hidden_size)


@pytest.mark.parametrize("name", NAMES)
def test_tl_weights_in_transformerlens_shapes_or_a_typed_refusal(family_model, name):
    model = family_model(name)
    L, H, d = model.num_layers, model.num_heads, model.hidden_size
    assert model.W_E.shape[1] == d and model.W_U.shape[0] == d
    cfg = model.cfg  # TransformerLens' summary: d_mlp None where no layer has a dense MLP
    assert cfg.n_layers == L and cfg.d_model == d
    assert cfg.d_mlp is None or cfg.d_mlp > 0
    for attr in ("W_Q", "W_K", "W_V", "W_O"):
        try:
            w = getattr(model, attr)
        except mi.MIError:  # MLA (no per-head W_Q / W_K) or per-layer head sizes (Gemma-4)
            continue
        assert w.shape[:2] == (L, H), (attr, w.shape)
        assert d in (w.shape[2], w.shape[3]), (attr, w.shape)


@pytest.mark.parametrize("name", NAMES)
def test_the_hooked_transformer_equals_the_kernel_or_refuses(built, name):
    from mi_core.tl import HookedTransformer

    try:
        tl = HookedTransformer.from_pretrained_no_processing(built(name).path)
    except mi.MIError as e:
        pytest.skip(f"typed refusal: {type(e).__name__}: {str(e).splitlines()[0]}")
    ids = ids_for(2, SEQ, seed=8)
    with torch.no_grad():
        ours = tl(ids)
        kernel = tl.mi_model.run_with_hooks(ids)
    assert (ours - kernel).abs().max().item() < 1e-4


_FLAGS = ["fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"]


@pytest.mark.parametrize("flag", _FLAGS)
@pytest.mark.parametrize("name", NAMES)
def test_process_weights_each_flag_keeps_the_softmax_or_is_refused(built, name, flag):
    model = mi.MIModel.from_pretrained(built(name).path)
    ids = ids_for(seed=9)
    before = model.forward(ids).output
    try:
        model.process_weights(**{f: f == flag for f in _FLAGS})
    except mi.MIError as e:
        assert "process_weights" in str(e) and flag.split("_")[0] in str(e)
        # a refusal leaves the weights as they were
        assert (model.forward(ids).output - before).abs().max().item() == 0.0
        return
    after = model.forward(ids).output
    shift = (after - before) - (after - before).mean(-1, keepdim=True)
    assert shift.abs().max().item() < 1e-4, flag


# --------------------------------------------------------------------------- padding, generation


@pytest.mark.parametrize("name", NAMES)
def test_left_padded_batch_rows_equal_each_row_alone(family_model, name):
    from tests.support.family_checks import assert_left_padding_rows_alone

    assert_left_padding_rows_alone(family_model(name), [ids_for(1, 10, seed=10)[0],
                                                        ids_for(1, 6, seed=11)[0]])


@pytest.mark.parametrize("name", NAMES)
def test_kv_cached_greedy_generation_equals_transformers(built, family_model, name):
    model, hf = family_model(name), built(name).hf
    ids = ids_for(2, 7, seed=12)
    ours = model.generate(ids, max_new_tokens=8, stop_at_eos=False)
    with torch.no_grad():
        ref = copy.deepcopy(hf).generate(ids, attention_mask=torch.ones_like(ids),
                                         max_new_tokens=8, do_sample=False,
                                         eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.tokens, ref)


@pytest.mark.parametrize("name", NAMES)
def test_attribution_patching_gradients_reach_the_changed_position_only(family_model, name):
    """Gradients through every family (capture_grad at resid_pre 0): the clean and corrupted
    runs differ only at position 2 there, so the attribution is finite, non-zero at 2 and
    exactly zero elsewhere."""
    from mi_core.interp import attribution_patching

    model = family_model(name)
    ids = ids_for(seed=13)
    corrupt = ids.clone()
    corrupt[0, 2] = 3 + (int(corrupt[0, 2]) + 7) % 125
    out = model.forward(ids).output[0, -1]
    metric = logit_diff_metric(int(out.argmax()), int(out.argmin()))
    r = attribution_patching(model, ids, corrupt, metric, "resid_pre", layers=[0])
    g = r.grid[0]
    assert torch.isfinite(g).all() and abs(float(g[2])) > 1e-6
    assert g[[0, 1]].abs().max().item() == 0.0 and g[3:].abs().max().item() == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_circuits_and_head_detection_run_or_refuse(family_model, name):
    from mi_core.interp import composition_scores, detect_heads, qk_circuit

    model = family_model(name)
    try:
        scores = composition_scores(model, "k")
    except mi.MIError:  # no per-head W_Q / W_K (MLA) or per-layer head sizes: typed
        pass
    else:
        L, H = model.num_layers, model.num_heads
        assert scores.scores.shape == (L, H, L, H) and torch.isfinite(scores.scores).all()
        assert qk_circuit(model, 0).AB.shape == (H, model.hidden_size, model.hidden_size)
    heads = detect_heads(model, show_progress=False)
    for kind, s in heads.scores.items():
        assert s.shape == (model.num_layers, model.num_heads), kind
        assert (s >= -1e-6).all() and (s <= 1 + 1e-6).all(), kind


@pytest.mark.parametrize("name", NAMES)
def test_generation_with_hooks_equals_recomputing_with_them(family_model, name):
    """Hooks apply at every cached step: greedy tokens with an intervention equal a loop of
    full forwards with the same intervention."""
    model = family_model(name)
    ids = ids_for(1, 6, seed=14)
    d = torch.randn(model.hidden_size, generator=torch.Generator().manual_seed(1))
    hooks = mi.HookSpec().intervene("blocks.0.hook_resid_post", mi.Add(2.0 * d))
    got = model.generate(ids, max_new_tokens=4, hooks=hooks, stop_at_eos=False).tokens
    seq = ids
    for _ in range(4):
        nxt = model.forward(seq, hooks).output[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(got, seq)
