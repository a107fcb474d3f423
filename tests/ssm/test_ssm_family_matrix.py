"""Every state-space, linear-attention and hybrid family × every analysis, view and state
intervention, through the public API only (an acceptance matrix: one cell per family and
analysis, so a family where a cell crashes, silently does nothing or gives wrong numbers shows).

Families: Mamba, Falcon-Mamba, Mamba-2, Jamba, Zamba2, Falcon-H1, Bamba, GraniteMoeHybrid,
Nemotron-H, LFM2 (dense and MoE), Qwen3-Next, Qwen3.5 (text, the released wrapper, MoE),
MiniMax, OLMo hybrid, RWKV-6 and RWKV-7. Checkpoints: the tiny random ones of tests/support
(ssm_tiny, hybrid_tiny, hybrid2_tiny, linear_tiny, zamba2_minimax_tiny, rwkv_ckpt), built once
per session. Which
layer is what is read from the model alone: a layer with a `*.hook_effective_attn` point has a
recurrent mixer, one with `attn.hook_pattern` softmax attention (Falcon-H1 and Zamba2 layers
have both); `model.layer_types` names them.

Tolerances: A @ x == y to 1e-5 relative (F32, the exact effective attention); sums and
restored patching metrics to 1e-4 (F32 rounding of unit-scale activations); "changes the
output" means > 1e-4 somewhere (measured effects are 1e-2 .. 1). Parity with transformers
(logits, residual streams, padding, generation) is in each family's parity test; the matrix
repeats left padding and greedy generation as one cell each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import mi_core as mi
from mi_core.interp import (
    KnockoutSpec, LogitLensAnalysis, SteeringSpec, apply_steering, decompose_resid,
    knockout_hooks, layer_attention, logit_diff_metric, patching_grid, run_for_decomposition,
    run_state_knockout, run_state_steering,
)

#: family -> (builder module, name in its table)
FAMILIES: dict[str, tuple[str, str]] = {
    "mamba": ("ssm", "mamba"), "falcon_mamba": ("ssm", "falcon_mamba"),
    "mamba2": ("ssm", "mamba2"), "jamba": ("hybrid", "jamba"), "zamba2": ("zm", "zamba2"),
    "falcon_h1": ("hybrid2", "falcon_h1"), "bamba": ("hybrid", "bamba"),
    "granitemoehybrid": ("hybrid", "granitemoehybrid"), "nemotron_h": ("hybrid", "nemotron_h"),
    "lfm2": ("hybrid2", "lfm2"), "qwen3_next": ("linear", "qwen3_next"),
    "qwen3_5_text": ("linear", "qwen3_5_text"), "qwen3_5": ("linear", "qwen3_5"),
    "qwen3_5_moe": ("linear", "qwen3_5_moe"), "lfm2_moe": ("hybrid2", "lfm2_moe"),
    "minimax": ("zm", "minimax"), "olmo_hybrid": ("linear", "olmo_hybrid"),
    "rwkv6": ("rwkv", "6"), "rwkv7": ("rwkv", "7"),
}
NAMES = list(FAMILIES)
SEQ = 7
_BUILT: dict[str, Any] = {}
_MODELS: dict[str, mi.MIModel] = {}


def _build(root: Path, name: str) -> Any:
    """(checkpoint path, transformers model or None) of family `name`."""
    kind, key = FAMILIES[name]
    if kind == "ssm":
        from tests.support.ssm_tiny import make_tiny_ssm
        t = make_tiny_ssm(root, key)
    elif kind == "hybrid":
        from tests.support.hybrid_tiny import tiny_hybrid
        t = tiny_hybrid(key)
    elif kind == "hybrid2":
        from tests.support.hybrid2_tiny import tiny_hybrid2
        t = tiny_hybrid2(key)
    elif kind == "zm":
        from tests.support.zamba2_minimax_tiny import tiny_zm
        t = tiny_zm(key)
    elif kind == "linear":
        from tests.support.linear_tiny import make_tiny_linear
        t = make_tiny_linear(root, key)
    else:
        from tests.support import rwkv_ckpt
        v7 = key == "7"
        tensors = (rwkv_ckpt.v7_tensors if v7 else rwkv_ckpt.v6_tensors)(2, 128, 64, 300)
        config = (rwkv_ckpt.v7_config if v7 else rwkv_ckpt.v6_config)(2, 128, 64, 300)
        return rwkv_ckpt.write_checkpoint(root / f"rwkv{key}", tensors, config), None
    return t.path, t.hf


@pytest.fixture(scope="session")
def family_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], mi.MIModel]:
    root = tmp_path_factory.mktemp("family_matrix")

    def get(name: str) -> mi.MIModel:
        if name not in _MODELS:
            _BUILT[name] = _build(root, name)
            _MODELS[name] = mi.MIModel.from_pretrained(_BUILT[name][0])
        return _MODELS[name]

    return get


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def ids_for(model: mi.MIModel, batch: int = 1, seq: int = SEQ, seed: int = 0) -> torch.Tensor:
    """Token ids in [3, min(vocab, 64)) (no pad / bos / eos)."""
    hi = min(model.vocab_size, 64)
    return torch.randint(3, hi, (batch, seq), generator=torch.Generator().manual_seed(seed))


def points_of(model: mi.MIModel) -> list[str]:
    return [p.name for p in model.hook_points()]


def recurrent_layers(model: mi.MIModel) -> dict[int, str]:
    """layer -> its mixer's effective-attention point."""
    out = {}
    for p in points_of(model):
        if p.endswith(".hook_effective_attn"):
            out[int(p.split(".")[1])] = p
    return out


def attention_layers(model: mi.MIModel) -> list[int]:
    return [i for i in range(model.num_layers)
            if f"blocks.{i}.attn.hook_pattern" in points_of(model)]


def x_and_y(cache: Any, eff: str) -> tuple[str, str, Callable[[torch.Tensor, torch.Tensor],
                                                                torch.Tensor]]:
    """The points A @ x == y reads for the effective-attention point `eff`, and how x is
    laid out per head (docs/HOOKS.md)."""
    base = eff.rsplit(".", 1)[0]
    layer = eff.split(".")[1]
    if base.endswith(".ssm"):  # x = the conv's first E channels per head; y = hook_y
        return f"{base}.hook_conv", f"{base}.hook_y", lambda x, y: x[..., :y.shape[2] *
                                                                    y.shape[3]].reshape(y.shape)
    if base.endswith(".conv"):  # per channel: x = conv.hook_x, y = conv.hook_y
        return f"{base}.hook_x", f"{base}.hook_y", lambda x, y: x
    # linear attention and RWKV: A @ hook_v == hook_z per head
    return f"blocks.{layer}.attn.hook_v", f"blocks.{layer}.attn.hook_z", lambda x, y: x


# --------------------------------------------------------------------------- hook points


_SSM_POINTS = ("ssm.hook_in_proj", "ssm.hook_conv", "ssm.hook_dt", "ssm.hook_B", "ssm.hook_C",
               "ssm.hook_state", "ssm.hook_y", "ssm.hook_gate", "ssm.hook_effective_attn")
_LINEAR_POINTS = ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z", "attn.hook_state",
                  "attn.hook_effective_attn")


@pytest.mark.parametrize("name", NAMES)
def test_layer_types_and_every_mixers_documented_points_and_shapes(family_model, name):
    model = family_model(name)
    types = model.layer_types
    assert len(types) == model.num_layers and all(isinstance(t, str) and t for t in types)
    pts = points_of(model)
    rec = recurrent_layers(model)
    assert rec, "a recurrent family has recurrent layers"
    b, s = 2, 5
    cache = model.forward(ids_for(model, b, s), mi.HookSpec().capture_all(pts))
    for i in range(model.num_layers):
        assert f"blocks.{i}.hook_resid_pre" in pts and f"blocks.{i}.hook_resid_post" in pts
        if i in rec and ".ssm." in rec[i]:
            for p in _SSM_POINTS:
                assert f"blocks.{i}.{p}" in pts, (i, p)
            y = cache[f"blocks.{i}.ssm.hook_y"]
            h, hd = y.shape[2], y.shape[3]
            e = h * hd
            g, n = cache[f"blocks.{i}.ssm.hook_B"].shape[2:]
            assert y.shape[:2] == (b, s)
            assert cache[f"blocks.{i}.ssm.hook_C"].shape == (b, s, g, n)
            assert cache[f"blocks.{i}.ssm.hook_state"].shape == (b, s, h, hd, n)
            assert cache[f"blocks.{i}.ssm.hook_gate"].shape == (b, s, e)
            assert cache[f"blocks.{i}.ssm.hook_effective_attn"].shape == (b, h, s, s)
            dt = cache[f"blocks.{i}.ssm.hook_dt"].shape
            assert dt == (b, s, h)  # Mamba-1: h = d_inner (each channel a head)
            conv = cache[f"blocks.{i}.ssm.hook_conv"].shape
            assert conv in ((b, s, e), (b, s, e + 2 * g * n)), conv
            assert cache[f"blocks.{i}.ssm.hook_in_proj"].shape[:2] == (b, s)
        if i in rec and rec[i].endswith("attn.hook_effective_attn"):
            for p in _LINEAR_POINTS:
                assert f"blocks.{i}.{p}" in pts, (i, p)
            z = cache[f"blocks.{i}.attn.hook_z"]
            assert cache[f"blocks.{i}.attn.hook_effective_attn"].shape == (b, z.shape[2], s, s)
            assert cache[f"blocks.{i}.attn.hook_state"].shape[:3] == (b, s, z.shape[2])
        if i in rec:
            assert f"blocks.{i}.hook_mixer_out" in pts or ".rwkv." in rec[i], i
            if f"blocks.{i}.hook_mixer_out" in pts:
                assert cache[f"blocks.{i}.hook_mixer_out"].shape == (b, s, model.hidden_size)
        if i in attention_layers(model):
            for p in ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores",
                      "attn.hook_pattern", "attn.hook_z"):
                assert f"blocks.{i}.{p}" in pts, (i, p)
            assert cache[f"blocks.{i}.attn.hook_pattern"].shape[-2:] == (s, s)
        if i not in rec:  # no recurrent mixer: no state points
            assert not any(p.startswith(f"blocks.{i}.") and p.endswith("hook_state")
                           for p in pts), i


@pytest.mark.parametrize("name", NAMES)
def test_state_and_effective_attention_are_captured_only_when_asked(family_model, name):
    model = family_model(name)
    ids = ids_for(model)
    logits, cache = model.run_with_cache(ids)
    assert not any(k.endswith(("hook_state", "hook_effective_attn")) for k in cache.keys())
    eff = next(iter(recurrent_layers(model).values()))
    state = eff.replace("hook_effective_attn", "hook_state")
    _, asked = model.run_with_cache(ids, names_filter=[state, eff])
    assert state in asked and eff in asked
    if ".rwkv." not in state:  # (RWKV's is the state after the call's last token)
        assert asked[state].shape[:2] == (1, SEQ)
    # capturing the state reads the outputs from the per-step states: same numbers
    hooked = model.forward(ids, mi.HookSpec().capture(state)).output
    assert (hooked - logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_effective_attention_times_x_is_y_on_every_recurrent_layer(family_model, name):
    model = family_model(name)
    ids = ids_for(model, 2, SEQ, seed=3)
    rec = recurrent_layers(model)
    pts = []
    for eff in rec.values():
        xp, yp, _ = x_and_y(None, eff)
        pts += [eff, xp, yp]
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    for layer, eff in rec.items():
        xp, yp, lay = x_and_y(cache, eff)
        a, y = cache[eff].double(), cache[yp].double()
        y = y.reshape(*y.shape[:3], -1)  # [b, s, H, P] (conv: [b, s, d] -> [b, s, d, 1])
        x = lay(cache[xp].double(), y).reshape(y.shape)
        got = torch.einsum("bhts,bshp->bthp", a, x)
        rel = (got - y).abs().max().item() / y.abs().max().item()
        assert rel < 1e-5, (layer, eff, rel)
        assert a.triu(1).abs().max().item() == 0.0  # causal


# --------------------------------------------------------------------------- interventions


@pytest.mark.parametrize("name", NAMES)
def test_state_knockout_and_steering_on_every_recurrent_layer_and_head(family_model, name):
    model = family_model(name)
    ids = ids_for(model, seed=5)
    plain = model.forward(ids).output
    for layer, eff in recurrent_layers(model).items():
        ko = run_state_knockout(model, ids, mi.StateKnockoutSpec(positions=[2]).layer(layer))
        # positions before the knocked-out write are untouched; from it on the output moves
        # (the mixer's own output by O(1); the logits by > 1e-5: Falcon-H1's small
        # multipliers make its last layer's mixer a small term beside the residual stream)
        assert ko.kl_per_position()[:2].abs().max().item() < 1e-10, layer
        assert (ko.intervened_logits - plain)[:, 2:].abs().max().item() > 1e-5, layer
        out = f"blocks.{layer}.attn.hook_z" if ".rwkv." in eff else \
            f"blocks.{layer}.hook_mixer_out"
        spec = mi.HookSpec().capture(out)
        mixed = model.forward(ids, spec).require(out)
        knocked = model.forward(ids, mi.HookSpec().capture(out).set_state_knockout(
            mi.StateKnockoutSpec(positions=[2]).layer(layer))).require(out)
        assert (mixed - knocked)[:, :2].abs().max().item() == 0.0, layer
        # (RWKV-6's output at p reads the state before p's write: it moves from p + 1 on)
        moved = (mixed - knocked)[:, 2:].abs().max().item()
        assert moved > 1e-3 * mixed.abs().max().item(), layer
        one = model.forward(ids, mi.HookSpec().set_state_knockout(
            mi.StateKnockoutSpec(positions=[2]).layer(layer).heads([0]))).output
        assert (one - plain).abs().max().item() > 1e-6, layer  # one head alone acts
        assert (one - ko.intervened_logits).abs().max().item() > 1e-6, layer  # and not all
        # steering the write by 0 is the knockout; by 3 moves the output
        zero = run_state_steering(model, ids, mi.StateSteeringSpec(0.0, positions=[2])
                                  .layer(layer))
        assert (zero.intervened_logits - ko.intervened_logits).abs().max().item() < 1e-4
        st = run_state_steering(model, ids, mi.StateSteeringSpec(3.0, positions=[2])
                                .layer(layer))
        assert (st.intervened_logits - plain)[:, 2:].abs().max().item() > 1e-5, layer
    for layer in range(model.num_layers):
        if layer in recurrent_layers(model):
            continue
        with pytest.raises(mi.InterventionError, match=f"layer {layer} is a"):
            model.forward(ids, mi.HookSpec().set_state_knockout(
                mi.StateKnockoutSpec(positions=[2]).layer(layer)))
    with pytest.raises(mi.MIError):  # a head out of range: refused, not ignored
        model.forward(ids, mi.HookSpec().set_state_knockout(
            mi.StateKnockoutSpec(positions=[2]).heads([10_000])))


@pytest.mark.parametrize("name", NAMES)
def test_attention_knockout_where_there_is_attention_and_a_typed_refusal_elsewhere(
        family_model, name):
    model = family_model(name)
    ids = ids_for(model, seed=6)
    plain = model.forward(ids).output
    for layer in attention_layers(model):
        hooks = knockout_hooks(model, KnockoutSpec(layers=[layer], from_positions=[-1],
                                                   to_positions=[0, 1, 2]), SEQ)
        out = model.forward(ids, hooks).output
        assert (out - plain)[:, :-1].abs().max().item() < 1e-4, layer
        assert (out - plain)[:, -1].abs().max().item() > 1e-4, layer
    attn = attention_layers(model)
    if attn:  # side by side in one run: attention knockout and a state knockout
        both = knockout_hooks(model, KnockoutSpec(layers=attn[:1], from_positions=[-1],
                                                  to_positions=[0, 1, 2]), SEQ)
        both.set_state_knockout(mi.StateKnockoutSpec(positions=[3]))
        out_both = model.forward(ids, both).output
        state_only = model.forward(ids, mi.HookSpec().set_state_knockout(
            mi.StateKnockoutSpec(positions=[3]))).output
        assert (out_both - plain)[:, :3].abs().max().item() < 1e-4  # neither acts before 3
        assert (out_both - state_only)[:, -1].abs().max().item() > 1e-6
        assert (out_both - state_only)[:, :-1].abs().max().item() < 1e-4
    for layer in range(model.num_layers):
        if layer in attention_layers(model):
            continue
        with pytest.raises(mi.HookError, match=f"layer {layer} is a"):
            knockout_hooks(model, KnockoutSpec(layers=[layer], from_positions=[-1],
                                               to_positions=[0]), SEQ)
        with pytest.raises(mi.HookError, match=f"layer {layer} is a"):
            apply_steering(model, ids, SteeringSpec.attention([layer], [0], scale=2.0))
        with pytest.raises(mi.HookError, match=f"layer {layer} is a"):
            model.forward(ids, mi.HookSpec().capture(f"blocks.{layer}.attn.hook_pattern"))


@pytest.mark.parametrize("name", NAMES)
def test_attention_and_residual_steering(family_model, name):
    model = family_model(name)
    ids = ids_for(model, seed=7)
    for layer in attention_layers(model)[:1]:
        r = apply_steering(model, ids, SteeringSpec.attention([layer], to_positions=[0],
                                                              scale=4.0))
        assert r.steered_attention > r.baseline_attention
        assert (r.steered_logits - r.baseline_logits).abs().max().item() > 1e-4
    d = torch.randn(model.hidden_size, generator=torch.Generator().manual_seed(0))
    for layer in (0, model.num_layers - 1):
        r = apply_steering(model, ids, SteeringSpec.residual([layer], d, strength=3.0))
        assert (r.steered_logits - r.baseline_logits).abs().max().item() > 1e-3, layer


@pytest.mark.parametrize("name", NAMES)
def test_an_intervention_at_every_recurrent_point_acts_and_unknown_points_raise(
        family_model, name):
    model = family_model(name)
    ids = ids_for(model, seed=8)
    plain = model.forward(ids).output
    for eff in recurrent_layers(model).values():
        base = eff.rsplit(".", 1)[0]
        layer = int(eff.split(".")[1])
        for p in points_of(model):
            if not p.startswith(base + ".") and p != f"blocks.{layer}.hook_mixer_out":
                continue
            if p.endswith(("hook_effective_attn", "hook_decay")):
                continue  # a view of the mixer / a constant read elsewhere
            if p.endswith("rwkv.hook_state"):
                continue  # RWKV's: the state carried to the next call (docs/RWKV.md)
            out = model.forward(ids, mi.HookSpec().intervene(p, mi.Scale(0.5))).output
            assert (out - plain).abs().max().item() > 1e-6, p
    with pytest.raises(mi.HookError):
        model.forward(ids, mi.HookSpec().capture(f"blocks.{model.num_layers}.hook_resid_pre"))
    with pytest.raises(mi.HookError):
        model.forward(ids, mi.HookSpec().intervene("blocks.0.ssm.hook_nothing", mi.Zero()))


# --------------------------------------------------------------------------- analyses


@pytest.mark.parametrize("name", NAMES)
def test_logit_lens_patching_and_decomposition(family_model, name):
    model = family_model(name)
    ids = ids_for(model, seed=9)
    out = model.forward(ids).output[0, -1]
    lens = LogitLensAnalysis(k=3).run(model, ids)
    assert len(lens.points) == model.num_layers
    assert [t.token_id for t in lens.points[-1].top] == out.topk(3).indices.tolist()
    corrupt = ids.clone()
    corrupt[0, 1] = 3 + (int(corrupt[0, 1]) - 2) % (min(model.vocab_size, 64) - 3)
    top = int(out.argmax())
    metric = logit_diff_metric(top, int(out.argmin()))
    # the last residual at the last position restores the clean metric, at the first
    # (where the prompts agree and which the last position reads only through the layers)
    # changes nothing
    last = model.num_layers - 1
    g = patching_grid(model, ids, corrupt, metric, "resid_post", layers=[last],
                      positions=[0, -1], show_progress=False)
    assert abs(float(g.grid[0, 1]) - 1.0) < 1e-4 and abs(float(g.grid[0, 0])) < 1e-3
    g = patching_grid(model, ids, corrupt, metric, "resid_pre", layers=[0, 1],
                      show_progress=False)
    assert g.grid.shape == (2, SEQ) and g.grid[:, 0].abs().max().item() < 1e-3
    assert g.grid[:, 1].abs().max().item() > 1e-2  # the corrupted position matters
    rec = sorted(recurrent_layers(model))
    if f"blocks.{rec[0]}.hook_mixer_out" in points_of(model):
        m = patching_grid(model, ids, corrupt, metric, "mixer_out", layers=[rec[0]],
                          show_progress=False)
        assert torch.isfinite(m.grid).all() and m.grid.abs().max().item() > 1e-4
    try:
        cache = run_for_decomposition(model, ids)
    except mi.CapabilityError as e:  # a residual stream that is not a sum (MiniMax)
        assert "sum" in str(e) or "plus" in str(e)
        return
    stack, labels = decompose_resid(cache, model.num_layers)
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    assert (stack.sum(0) - final).abs().max().item() < 1e-4
    assert len(labels) == stack.shape[0] > model.num_layers


@pytest.mark.parametrize("name", NAMES)
def test_the_transformerlens_layer_runs_and_its_cache_decomposes(family_model, name):
    model = family_model(name)
    ids = ids_for(model, seed=10)
    logits, cache = model.run_with_cache(ids)
    assert (logits - model.forward(ids).output).abs().max().item() < 1e-4
    acc = cache.accumulated_resid()
    assert acc.shape[0] == model.num_layers + 1
    cfg = model.cfg  # TransformerLens' summary: d_mlp None where no layer has a dense MLP
    assert cfg.n_layers == model.num_layers and (cfg.d_mlp is None or cfg.d_mlp > 0)
    assert cache["resid_post", model.num_layers - 1].shape == (1, SEQ, model.hidden_size)
    try:
        stack = cache.decompose_resid()
    except mi.CapabilityError:
        return
    final = cache[f"blocks.{model.num_layers - 1}.hook_resid_post"]
    assert (stack.sum(0) - final).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_an_sae_splices_into_a_recurrent_mixers_input(family_model, name, tmp_path):
    from tests.support.sae_tiny_backend import write_saelens_sae

    model = family_model(name)
    layer = sorted(recurrent_layers(model))[0]
    ids = ids_for(model, seed=11)
    plain = model.forward(ids).output
    for point in (f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.hook_mixer_out"):
        if point not in points_of(model):  # (RWKV: its time mix is hook_attn_out)
            point = f"blocks.{layer}.hook_attn_out"
        sae = mi.load_dictionary(write_saelens_sae(tmp_path / point, point, model.hidden_size,
                                                   48))
        spliced = model.forward(ids, sae.splice(mi.HookSpec(), model=model)).output
        assert (spliced - plain).abs().max().item() > 1e-4, point
        exact = model.forward(ids, sae.splice(mi.HookSpec(), include_error=True,
                                              model=model)).output
        assert (exact - plain).abs().max().item() < 1e-4, point


@pytest.mark.parametrize("name", NAMES)
def test_the_attention_views_read_each_layers_own_attention(family_model, name, tmp_path):
    from mi_core.viz import attention_html, effective_attention_html

    model = family_model(name)
    ids = ids_for(model, seed=12)
    toks = [f"t{i}" for i in range(SEQ)]
    rec = recurrent_layers(model)
    for layer in range(model.num_layers):
        if layer not in rec and layer not in attention_layers(model):
            with pytest.raises(mi.HookError, match=f"layer {layer} is a"):
                layer_attention(model, ids, layer)
            continue
        a, point = layer_attention(model, ids, layer)
        assert a.shape[-2:] == (SEQ, SEQ)
        if layer in attention_layers(model):
            assert point.name == f"blocks.{layer}.attn.hook_pattern"
            assert (a.sum(-1) - 1).abs().max().item() < 1e-5
            page = attention_html(toks, a[0], tmp_path / f"p{layer}.html", layer=layer)
        else:
            assert point.name == rec[layer]
            page = effective_attention_html(toks, a[0], tmp_path / f"e{layer}.html", layer)
            assert "effective attention" in page.read_text()
        assert page.exists()


# --------------------------------------------------------------------------- padding, generation


@pytest.mark.parametrize("name", NAMES)
def test_left_padded_batch_rows_equal_each_row_alone(family_model, name):
    model = family_model(name)
    long, short = ids_for(model, 1, 8, seed=13)[0], ids_for(model, 1, 5, seed=14)[0]
    ids = torch.zeros(2, 8, dtype=torch.long)
    mask = torch.zeros(2, 8, dtype=torch.long)
    ids[0], mask[0] = long, 1
    ids[1, 3:], mask[1, 3:] = short, 1
    batch = model.forward(ids, attention_mask=mask).output
    assert (batch[0] - model.forward(long[None]).output[0]).abs().max().item() < 1e-4
    assert (batch[1, 3:] - model.forward(short[None]).output[0]).abs().max().item() < 1e-4
    # the padded row's effective attention over its real tokens and its per-step states are
    # the row's alone (pads are skipped: no write, no decay); measured <= 7e-6
    for eff in recurrent_layers(model).values():
        pts = [eff, eff.replace("hook_effective_attn", "hook_state")]
        padded = model.forward(ids, mi.HookSpec().capture_all(pts), attention_mask=mask)
        alone = model.forward(short[None], mi.HookSpec().capture_all(pts))
        assert (padded[eff][1, :, 3:, 3:] - alone[eff][0]).abs().max().item() < 1e-4, eff
        if ".rwkv." not in eff:  # (RWKV's state is the last one only)
            assert (padded[pts[1]][1, 3:] - alone[pts[1]][0]).abs().max().item() < 1e-4, eff


@pytest.mark.parametrize("name", [n for n in NAMES if not n.startswith("rwkv")])
def test_state_cached_greedy_generation_equals_transformers(family_model, name):
    model = family_model(name)
    hf = _BUILT[name][1]
    ids = ids_for(model, 1, 6, seed=15)
    with torch.no_grad():
        theirs = hf.generate(ids, max_new_tokens=6, do_sample=False,
                             attention_mask=torch.ones_like(ids))[0, 6:].tolist()
    ours = model.generate(ids, max_new_tokens=6, stop_at_eos=False).tokens[0, 6:].tolist()
    eos = hf.generation_config.eos_token_id
    n = ours.index(eos) + 1 if isinstance(eos, int) and eos in ours else len(ours)
    assert ours[:n] == theirs[:n]


@pytest.mark.parametrize("name", NAMES)
def test_effective_attention_includes_a_state_knockout(family_model, name):
    """Under a state knockout at position 2, A @ x == y still holds and A's column 2 is zero
    below the diagonal (the write is gone; the D skip, on the diagonal, is not a write)."""
    model = family_model(name)
    ids = ids_for(model, 1, SEQ, seed=16)
    for layer, eff in recurrent_layers(model).items():
        xp, yp, lay = x_and_y(None, eff)
        hooks = mi.HookSpec().capture_all([eff, xp, yp]).set_state_knockout(
            mi.StateKnockoutSpec(positions=[2]).layer(layer))
        cache = model.forward(ids, hooks)
        a, y = cache[eff].double(), cache[yp].double()
        y = y.reshape(*y.shape[:3], -1)
        x = lay(cache[xp].double(), y).reshape(y.shape)
        got = torch.einsum("bhts,bshp->bthp", a, x)
        assert (got - y).abs().max().item() < 1e-5 * y.abs().max().item(), layer
        assert a[:, :, 3:, 2].abs().max().item() == 0.0, layer


_FLAGS = ["fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"]


@pytest.mark.parametrize("name", NAMES)
def test_process_weights_each_flag_keeps_the_softmax_or_is_refused(family_model, name):
    ids = ids_for(family_model(name), seed=17)
    for flag in _FLAGS:
        model = mi.MIModel.from_pretrained(_BUILT[name][0])
        before = model.forward(ids).output
        try:
            model.process_weights(**{f: f == flag for f in _FLAGS})
        except mi.MIError as e:
            assert flag.split("_")[0] in str(e) or "process_weights" in str(e), (flag, e)
            assert (model.forward(ids).output - before).abs().max().item() == 0.0, flag
            continue
        after = model.forward(ids).output
        shift = (after - before) - (after - before).mean(-1, keepdim=True)
        assert shift.abs().max().item() < 1e-4, flag


@pytest.mark.parametrize("name", NAMES)
def test_the_hooked_transformer_equals_the_kernel_or_refuses(family_model, name):
    from mi_core.tl import HookedTransformer

    model = family_model(name)
    try:
        tl = HookedTransformer.from_pretrained_no_processing(_BUILT[name][0])
    except mi.MIError as e:
        pytest.skip(f"typed refusal: {type(e).__name__}: {str(e).splitlines()[0]}")
    ids = ids_for(model, 2, SEQ, seed=18)
    with torch.no_grad():
        ours = tl(ids)
    assert (ours - model.forward(ids).output).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_the_hooked_transformers_default_cache_leaves_out_states_and_effective_attention(
        family_model, name):
    """HookedTransformer.run_with_cache() without a filter captures no per-step state and no
    effective attention (each [b, heads, s, s] per layer), as MIModel.run_with_cache; a
    filter or a name that asks for them gets them (regression: the default captured both)."""
    from mi_core.tl import HookedTransformer

    model = family_model(name)
    try:
        tl = HookedTransformer.from_pretrained_no_processing(_BUILT[name][0])
    except mi.MIError as e:
        pytest.skip(f"typed refusal: {type(e).__name__}: {str(e).splitlines()[0]}")
    ids = ids_for(model, 1, SEQ, seed=20)
    opt_in = ("hook_state", "hook_effective_attn")
    with torch.no_grad():
        _, cache = tl.run_with_cache(ids)
        assert not [k for k in cache.keys() if k.endswith(opt_in)]
        eff = next(iter(recurrent_layers(model).values()))
        _, asked = tl.run_with_cache(ids, names_filter=lambda n: n.endswith(opt_in))
        _, named = tl.run_with_cache(ids, names_filter=eff)
    assert eff in asked and eff.replace("hook_effective_attn", "hook_state") in asked
    assert list(named.keys()) == [eff]


@pytest.mark.parametrize("name", NAMES)
def test_generation_with_hooks_and_a_state_knockout_equals_recomputing(family_model, name):
    """Hooks and state specs apply at every cached step (positions absolute across the
    steps): greedy tokens equal a loop of full forwards with the same spec."""
    model = family_model(name)
    ids = ids_for(model, 1, 6, seed=19)
    d = torch.randn(model.hidden_size, generator=torch.Generator().manual_seed(1))
    for hooks in (mi.HookSpec().intervene("blocks.0.hook_resid_post", mi.Add(2.0 * d)),
                  mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec(positions=[1, 4]))):
        got = model.generate(ids, max_new_tokens=4, hooks=hooks, stop_at_eos=False).tokens
        seq = ids
        for _ in range(4):
            nxt = model.forward(seq, hooks).output[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
        assert torch.equal(got, seq)


@pytest.mark.parametrize("name", NAMES)
def test_attribution_patching_gradients_flow_through_every_mixer(family_model, name):
    """capture_grad at resid_pre 0: the runs differ only at position 2, so the attribution is
    finite, non-zero there and exactly zero elsewhere (the gradient reached layer 0 through
    every recurrence)."""
    from mi_core.interp import attribution_patching

    model = family_model(name)
    ids = ids_for(model, seed=20)
    corrupt = ids.clone()
    corrupt[0, 2] = 3 + (int(corrupt[0, 2]) - 2) % (min(model.vocab_size, 64) - 3)
    out = model.forward(ids).output[0, -1]
    metric = logit_diff_metric(int(out.argmax()), int(out.argmin()))
    g = attribution_patching(model, ids, corrupt, metric, "resid_pre", layers=[0]).grid[0]
    assert torch.isfinite(g).all() and abs(float(g[2])) > 1e-6
    assert g[[0, 1]].abs().max().item() == 0.0 and g[3:].abs().max().item() == 0.0
