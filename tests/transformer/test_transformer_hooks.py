"""Hook points: documented shapes, capture, every intervention kind, and the semantics other
code relies on (frozen norms / attention via Replace, outputs feeding the residual)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mi_core as mi
from mi_core.errors import InterventionError

SEQ = 10
#: Points read only through ln1 / ln2 (TransformerLens' per-head and MLP inputs).
NORM_INPUTS = {"hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input", "hook_mlp_in"}


def _all_points(model: mi.MIModel) -> list[mi.HookPoint]:
    return model.hook_points()


@pytest.mark.parametrize("name", ["llama", "gemma2", "qwen3", "starcoder2"])
def test_every_hook_point_is_captured_with_its_documented_shape(tiny, make_ids, name):
    model = tiny(name).load()
    ids = make_ids(2, SEQ)
    points = _all_points(model)
    cache = model.forward(ids, mi.HookSpec().capture_all(points))
    assert len(cache) == len(points)
    for hp in points:
        want = tuple(SEQ if s == -1 else s for s in model.backend.hook_shape(hp, 2, SEQ))
        assert tuple(cache[hp].shape) == want, hp.name


def test_documented_shapes_in_tl_conventions(llama_model, make_ids):
    ids = make_ids(2, SEQ)
    be = llama_model.backend
    b, s, h, kv, hd, d = 2, SEQ, be.num_heads, be.num_kv_heads, be.d_head, be.hidden_size
    expect = {
        "blocks.1.attn.hook_q": (b, s, h, hd), "blocks.1.attn.hook_k": (b, s, kv, hd),
        "blocks.1.attn.hook_v": (b, s, kv, hd), "blocks.1.attn.hook_rot_q": (b, s, h, hd),
        "blocks.1.attn.hook_attn_scores": (b, h, s, s), "blocks.1.attn.hook_pattern": (b, h, s, s),
        "blocks.1.attn.hook_z": (b, s, h, hd), "blocks.1.attn.hook_result": (b, s, h, d),
        "blocks.1.ln1.hook_scale": (b, s, 1), "blocks.1.mlp.hook_pre": (b, s, be.d_mlp),
        "blocks.1.mlp.hook_post": (b, s, be.d_mlp), "hook_final_norm": (b, s, d),
    }
    cache = llama_model.forward(ids, mi.HookSpec().capture_all(expect))
    for name, shape in expect.items():
        assert tuple(cache[name].shape) == shape, name


def test_identity_replace_at_every_point_keeps_the_logits(llama_model, make_ids):
    ids = make_ids(2, SEQ)
    base = llama_model.forward(ids, mi.HookSpec().capture_all(_all_points(llama_model)))
    for hp in _all_points(llama_model):
        out = llama_model.forward(ids, mi.HookSpec().intervene(hp, mi.Replace(base[hp].clone())))
        assert (out.output - base.output).abs().max().item() < 1e-4, hp.name


@pytest.mark.parametrize("kind", ["add", "scale", "zero", "callable"])
def test_every_intervention_kind_changes_the_logits_at_every_point(llama_model, make_ids, kind):
    ids = make_ids(2, SEQ)
    base = llama_model.forward(ids).output
    g = torch.Generator().manual_seed(0)
    for hp in _all_points(llama_model):
        if hp.layer is not None and hp.layer != 1:  # one layer is enough; all kinds of point
            continue
        shape = tuple(SEQ if s == -1 else s for s in llama_model.backend.hook_shape(hp, 2, SEQ))
        iv = {"add": lambda: mi.Add(torch.randn(shape, generator=g)),
              "scale": lambda: mi.Scale(0.5),
              "zero": lambda: mi.Zero(),
              "callable": lambda: (lambda t, hook: t * 0.5 + 0.1)}[kind]()
        if kind == "zero" and hp.suffix.endswith("hook_scale"):
            iv = mi.Scale(2.0)  # a zero divisor is not a meaningful intervention
        if kind == "scale" and hp.suffix in NORM_INPUTS:
            iv = mi.Add(torch.ones(shape))  # RMSNorm(0.5 x) == RMSNorm(x) up to eps
        out = llama_model.forward(ids, mi.HookSpec().intervene(hp, iv)).output
        assert torch.isfinite(out).all(), hp.name
        assert (out - base).abs().max().item() > 1e-4, (kind, hp.name)


def test_hook_result_sums_over_heads_to_the_attention_output(llama_model, make_ids):
    ids = make_ids(2, SEQ)
    cache = llama_model.forward(ids, mi.HookSpec().capture("blocks.0.attn.hook_result")
                                .capture("blocks.0.hook_attn_out"))
    total = cache["blocks.0.attn.hook_result"].sum(dim=2)
    assert (total - cache["blocks.0.hook_attn_out"]).abs().max().item() < 1e-5


def test_hook_result_is_only_computed_when_requested(llama_model, make_ids, monkeypatch):
    import mi_transformer.attention as attn

    def boom(*a, **k):
        raise AssertionError("per-head result computed without being requested")

    monkeypatch.setattr(attn.torch, "einsum", boom)
    cache = llama_model.forward(make_ids(1, SEQ), mi.HookSpec().capture("blocks.0.attn.hook_z"))
    assert "blocks.0.attn.hook_result" not in cache


def test_knockout_of_all_keys_gives_zero_not_nan(llama_model, make_ids):
    ids = make_ids(2, SEQ)
    mask = torch.full((SEQ, SEQ), float("-inf"))
    hooks = (mi.HookSpec().intervene("blocks.0.attn.hook_attn_scores", mi.Knockout(mask))
             .capture("blocks.0.attn.hook_z").capture("blocks.0.attn.hook_pattern"))
    cache = llama_model.forward(ids, hooks)
    assert torch.isfinite(cache.output).all()
    assert cache["blocks.0.attn.hook_pattern"].abs().max().item() == 0.0
    assert cache["blocks.0.attn.hook_z"].abs().max().item() == 0.0


def test_knockout_of_one_edge_renormalises_the_rest(llama_model, make_ids):
    ids = make_ids(1, SEQ)
    pat = "blocks.1.attn.hook_pattern"
    before = llama_model.forward(ids, mi.HookSpec().capture(pat))[pat]
    mask = torch.zeros(SEQ, SEQ)
    mask[-1, 0] = float("-inf")
    after = llama_model.forward(ids, mi.HookSpec().intervene("blocks.1.attn.hook_scores",
                                                             mi.Knockout(mask)).capture(pat))[pat]
    row = before[0, :, -1].clone()
    row[:, 0] = 0
    assert (after[0, :, -1] - row / row.sum(-1, keepdim=True)).abs().max().item() < 1e-6


def test_replacing_the_norm_scale_freezes_the_norm(llama_model, make_ids):
    """A Replace at ln*.hook_scale is the divisor actually used (attribution freezes norms so)."""
    ids = make_ids(2, SEQ)
    names = ("blocks.1.ln2.hook_scale", "blocks.1.ln2.hook_normalized")
    base = llama_model.forward(ids, mi.HookSpec().capture_all(names))
    doubled = mi.HookSpec().intervene(names[0], mi.Replace(2 * base[names[0]])).capture(names[1])
    out = llama_model.forward(ids, doubled)
    assert (out[names[1]] - base[names[1]] / 2).abs().max().item() < 1e-6


def test_replacing_the_pattern_freezes_attention(llama_model, make_ids):
    """z is computed from the pattern returned by the hook (explicit path uses it)."""
    ids, other = make_ids(1, SEQ, seed=1), make_ids(1, SEQ, seed=2)
    pat, v, z = "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_v", "blocks.1.attn.hook_z"
    p_other = llama_model.forward(other, mi.HookSpec().capture(pat))[pat]
    cache = llama_model.forward(ids, mi.HookSpec().intervene(pat, mi.Replace(p_other))
                                .capture(v).capture(z))
    groups = llama_model.num_heads // llama_model.num_kv_heads
    vv = cache[v].repeat_interleave(groups, dim=2).transpose(1, 2)  # [b, h, s, d]
    want = torch.matmul(p_other, vv).transpose(1, 2)
    assert (cache[z] - want).abs().max().item() < 1e-5


def test_attn_out_and_mlp_out_interventions_feed_the_residual(llama_model, make_ids):
    ids = make_ids(2, SEQ)
    hooks = (mi.HookSpec().intervene("blocks.1.hook_mlp_out", mi.Zero())
             .intervene("blocks.1.hook_attn_out", mi.Zero())
             .capture("blocks.1.hook_resid_pre").capture("blocks.1.hook_resid_post"))
    cache = llama_model.forward(ids, hooks)
    assert torch.equal(cache["blocks.1.hook_resid_pre"], cache["blocks.1.hook_resid_post"])


def test_gated_mlp_hooks_are_neuron_space_gate_and_act_times_up(llama_model, make_ids):
    ids = make_ids(1, SEQ)
    names = ["blocks.0.mlp.hook_in", "blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post",
             "blocks.0.hook_mlp_out", "blocks.0.mlp.hook_pre_linear"]
    c = llama_model.forward(ids, mi.HookSpec().capture_all(names))
    x = c[names[0]]
    be = llama_model.backend
    assert (c[names[1]] - x @ be.get_weight("W_gate", 0)).abs().max().item() < 1e-5
    assert (c[names[4]] - x @ be.get_weight("W_up", 0)).abs().max().item() < 1e-5
    want_post = F.silu(c[names[1]]) * (x @ be.get_weight("W_up", 0))
    assert (c[names[2]] - want_post).abs().max().item() < 1e-5
    assert (c[names[3]] - c[names[2]] @ be.get_weight("W_out", 0)).abs().max().item() < 1e-5


def test_post_norm_models_apply_the_post_norm_before_attn_out(tiny, make_ids):
    model = tiny("gemma2").load()
    names = ["blocks.0.ln1_post.hook_normalized", "blocks.0.hook_attn_out"]
    c = model.forward(make_ids(1, SEQ), mi.HookSpec().capture_all(names))
    gain = 1 + model.backend.w.layers[0].ln1_post.weight  # Gemma's RMSNorm multiplies by 1 + w
    assert (c[names[0]] * gain - c[names[1]]).abs().max().item() < 1e-6


def test_wrongly_shaped_operand_is_rejected_before_compute(llama_model, make_ids):
    with pytest.raises(InterventionError, match="blocks.0.hook_resid_post"):
        llama_model.forward(make_ids(2, SEQ),
                            mi.HookSpec().intervene("blocks.0.hook_resid_post",
                                                    mi.Add(torch.zeros(SEQ, 7))))


def test_unknown_layer_is_an_error_before_compute(llama_model, make_ids):
    with pytest.raises(mi.HookError, match="out of range"):
        llama_model.forward(make_ids(1, SEQ), mi.HookSpec().capture("blocks.9.hook_resid_post"))


def test_steer_that_zeroes_an_edge_equals_knocking_it_out(llama_model, make_ids):
    ids = make_ids(1, SEQ)
    edge = torch.zeros(SEQ, SEQ, dtype=torch.bool)
    edge[-1, 2] = True
    ko = torch.zeros(SEQ, SEQ).masked_fill(edge, float("-inf"))
    steered = llama_model.forward(ids, mi.HookSpec().intervene(
        "blocks.1.attn.hook_pattern", mi.Steer(edge, scale=0.0))).output
    knocked = llama_model.forward(ids, mi.HookSpec().intervene(
        "blocks.1.attn.hook_attn_scores", mi.Knockout(ko))).output
    assert (steered - knocked).abs().max().item() < 1e-5


def test_run_with_cache_captures_every_point_but_the_opt_in_result(llama_model, make_ids):
    logits, cache = llama_model.run_with_cache(make_ids(1, SEQ))
    assert "blocks.0.attn.hook_result" not in cache
    assert "blocks.2.attn.hook_pattern" in cache and "hook_final_norm" in cache
    assert (logits - llama_model.forward(make_ids(1, SEQ)).output).abs().max().item() < 1e-5


def test_gradients_flow_with_frozen_norms_and_attention(llama_model, make_ids):
    """With grad enabled, a residual injected by Replace gets a gradient; with every norm
    scale and pattern frozen (detached Replace) the map resid -> logits is linear in it."""
    ids = make_ids(1, SEQ)
    pts = [p for p in llama_model.hook_points()
           if p.suffix.endswith("hook_scale") or p.suffix == "attn.hook_pattern"]
    base = llama_model.forward(ids, mi.HookSpec().capture_all(pts + ["blocks.1.hook_resid_pre"]))
    frozen = mi.HookSpec()
    for p in pts:
        frozen.intervene(p, mi.Replace(base[p].detach()))

    def logits_of(resid: torch.Tensor) -> torch.Tensor:
        spec = frozen.copy().intervene("blocks.1.hook_resid_pre", mi.Replace(resid))
        return llama_model.forward(ids, spec).output

    with torch.enable_grad():
        r = base["blocks.1.hook_resid_pre"].clone().requires_grad_(True)
        logits_of(r)[0, -1, 5].backward()
    assert r.grad is not None and torch.isfinite(r.grad).all() and r.grad.abs().sum() > 0
    # frozen attention and norms leave only linear maps except the MLP: check the attention
    # sublayer alone is linear by zeroing MLPs
    no_mlp = frozen.copy()
    for i in range(llama_model.num_layers):
        no_mlp.intervene(f"blocks.{i}.hook_mlp_out", mi.Zero())
    r0 = base["blocks.1.hook_resid_pre"]
    d = torch.randn(r0.shape, generator=torch.Generator().manual_seed(1))

    def f(resid: torch.Tensor) -> torch.Tensor:
        return llama_model.forward(ids, no_mlp.copy().intervene(
            "blocks.1.hook_resid_pre", mi.Replace(resid))).output

    assert (f(r0 + d) - f(r0) - (f(r0 + 2 * d) - f(r0 + d))).abs().max().item() < 1e-3


TL_INPUT_POINTS = ["blocks.1.hook_attn_in", "blocks.1.hook_q_input", "blocks.1.hook_k_input",
                   "blocks.1.hook_v_input", "blocks.1.hook_mlp_in", "blocks.1.mlp.hook_pre_linear",
                   "blocks.1.ln1.hook_normalized", "blocks.1.attn.hook_in",
                   "blocks.1.ln2.hook_normalized", "blocks.1.mlp.hook_in"]


def test_capturing_the_tl_input_points_does_not_change_the_logits(llama_model, make_ids):
    ids = make_ids(2, SEQ)
    base = llama_model.forward(ids).output
    cache = llama_model.forward(ids, mi.HookSpec().capture_all(TL_INPUT_POINTS))
    assert torch.equal(cache.output, base)
    assert len(cache) == len(TL_INPUT_POINTS)


def test_normalized_is_before_the_gain_and_hook_in_after_it(llama_model, make_ids):
    """TransformerLens' hook_normalized = x / scale; attn/mlp.hook_in = that times the gain."""
    be = llama_model.backend
    names = ["blocks.1.hook_resid_pre", "blocks.1.ln1.hook_scale", "blocks.1.hook_resid_mid",
             "blocks.1.ln2.hook_scale", "blocks.1.hook_mlp_in"] + TL_INPUT_POINTS
    c = llama_model.forward(make_ids(2, SEQ), mi.HookSpec().capture_all(names))
    for ln, resid, sub in (("ln1", "hook_resid_pre", "attn"), ("ln2", "hook_resid_mid", "mlp")):
        want = c[f"blocks.1.{resid}"] / c[f"blocks.1.{ln}.hook_scale"]
        assert (c[f"blocks.1.{ln}.hook_normalized"] - want).abs().max().item() < 1e-5
        gained = want * be.get_weight(f"{ln}.w", 1)
        assert (c[f"blocks.1.{sub}.hook_in"] - gained).abs().max().item() < 1e-5
    assert torch.equal(c["blocks.1.hook_mlp_in"], c["blocks.1.hook_resid_mid"])
    h, kv = llama_model.num_heads, llama_model.num_kv_heads
    resid = c["blocks.1.hook_resid_pre"]
    for name, n in (("hook_attn_in", h), ("hook_q_input", h), ("hook_k_input", kv),
                    ("hook_v_input", kv)):
        assert torch.equal(c[f"blocks.1.{name}"], resid[:, :, None].expand(-1, -1, n, -1)), name


def test_q_input_intervention_changes_only_that_heads_query(llama_model, make_ids):
    """Head 0 reads another prompt's residual: its query is that prompt's ln1 output times
    W_Q[0]; the other heads' queries and every key are unchanged."""
    ids, other = make_ids(1, SEQ, seed=1), make_ids(1, SEQ, seed=2)
    be = llama_model.backend
    names = ["blocks.1.hook_resid_pre", "blocks.1.attn.hook_in", "blocks.1.attn.hook_q",
             "blocks.1.attn.hook_k"]
    base = llama_model.forward(ids, mi.HookSpec().capture_all(names))
    alt = llama_model.forward(other, mi.HookSpec().capture_all(names))

    def patch(t, hook):
        t[:, :, 0] = alt["blocks.1.hook_resid_pre"][:, :]
        return t

    c = llama_model.forward(ids, mi.HookSpec().intervene("blocks.1.attn.hook_q_input", patch)
                            .capture_all(names[2:]))
    want0 = alt["blocks.1.attn.hook_in"] @ be.get_weight("W_Q", 1)[0]
    assert (c["blocks.1.attn.hook_q"][:, :, 0] - want0).abs().max().item() < 1e-5
    assert (c["blocks.1.attn.hook_q"][:, :, 1:] - base["blocks.1.attn.hook_q"][:, :, 1:]
            ).abs().max().item() < 1e-5
    assert (c["blocks.1.attn.hook_k"] - base["blocks.1.attn.hook_k"]).abs().max().item() < 1e-5
    assert (c.output - base.output).abs().max().item() > 1e-4


def test_mlp_in_intervention_feeds_ln2(llama_model, make_ids):
    ids = make_ids(1, SEQ)
    names = ["blocks.1.hook_resid_mid", "blocks.1.ln2.hook_scale", "blocks.1.ln2.hook_normalized"]
    c = llama_model.forward(ids, mi.HookSpec().intervene("blocks.1.hook_mlp_in", mi.Scale(-1.0))
                            .capture_all(names))
    base = llama_model.forward(ids, mi.HookSpec().capture_all(names))
    assert torch.equal(c[names[0]], base[names[0]])  # the residual itself is untouched
    assert (c[names[2]] + base[names[2]]).abs().max().item() < 1e-5  # ln2 saw -x
