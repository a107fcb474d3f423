"""Hook points and state interventions of Falcon-H1, LFM2 and LFM2-MoE.

Falcon-H1's layers have both sets of points (the mixer's first, as it runs first) with
``hook_mixer_out`` and ``hook_attn_out`` each the branch it names; LFM2's convolution layers
the ``conv.*`` points, its attention layers every attention point. Shapes as declared; what
the documented points carry against transformers' modules; effective attention (A @ x == y)
on every recurrent layer; interventions equal transformers with a forward hook on the same
module; state specs against a written-out convolution; the convolution's windows."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import mi_core as mi

from tests.support.hf_reference import assert_matches_hf_with_hook
from tests.support.hybrid2_tiny import HYBRID2_FAMILIES, HYBRID2_LAYER_TYPES, hybrid2_model, \
    tiny_hybrid2
from tests.support.ssm_tiny import ssm_ids


@pytest.fixture(params=sorted(HYBRID2_FAMILIES))
def name(request: pytest.FixtureRequest) -> str:
    return request.param


def test_each_layer_has_its_points_in_execution_order_with_their_shapes(name) -> None:
    model = hybrid2_model(name)
    names = [p.name for p in model.hook_points()]
    for i, kind in enumerate(HYBRID2_LAYER_TYPES[name]):
        p = f"blocks.{i}."
        mine = [n for n in names if n.startswith(p)]
        attn, ssm, conv = "attention" in kind, "mamba2" in kind, kind == "short_conv"
        assert (p + "attn.hook_pattern" in mine) == attn
        assert (p + "ssm.hook_y" in mine) == ssm and (p + "conv.hook_y" in mine) == conv
        assert (p + "hook_mixer_out" in mine) == (ssm or conv)
        assert (p + "attn.q_ln.hook_scale" in mine) == (attn and not ssm)  # LFM2's q/k norms
        order = [p + "ln1.hook_normalized", p + "ssm.hook_in", p + "conv.hook_in",
                 p + "hook_mixer_out", p + "attn.hook_in", p + "hook_attn_out",
                 p + "hook_resid_mid", p + "hook_mlp_out", p + "hook_resid_post"]
        at = [mine.index(n) for n in order if n in mine]
        assert at == sorted(at) and len(at) == 4 + 2 * (ssm or conv) + 2 * attn, (i, kind, at)
    ids = ssm_ids(2, 11, seed=1)
    cache = model.forward(ids, mi.HookSpec().capture_all(names))
    for n in names:
        want = model.backend.hook_shape(n, 2, 11)
        assert want is not None and len(want) == cache[n].dim(), n
        assert all(w in (-1, g) for w, g in zip(want, cache[n].shape)), (n, want)


def _module_io(hf: Any, ids: torch.Tensor, module: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of transformers' `module` in a forward of `ids`."""
    got: dict[str, torch.Tensor] = {}

    def hook(m: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        got["in"] = args[0] if args else kwargs["hidden_states"]
        got["out"] = out[0] if isinstance(out, tuple) else out

    handle = hf.get_submodule(module).register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            hf(ids)
    finally:
        handle.remove()
    return got["in"], got["out"]


@pytest.mark.parametrize("which", ["falcon_h1", "falcon_h1_norm"])
def test_falcon_h1_branch_points_carry_what_transformers_modules_read_and_add(which) -> None:
    """ssm.hook_in / attn.hook_in: ln1's output times ssm_in / attention_in multiplier (what
    in_proj and q/k/v_proj read); ssm.hook_in_proj: in_proj times the mup vector;
    hook_mixer_out / hook_attn_out: each branch times its out multiplier (what it adds);
    resid_mid = resid_pre + attn_out + mixer_out."""
    t, model = tiny_hybrid2(which), hybrid2_model(which)
    c = t.hf.config
    ids = ssm_ids(1, 10, seed=6)
    p = "blocks.1."
    cache = model.forward(ids, mi.HookSpec().capture_all(
        [p + s for s in ("ssm.hook_in", "ssm.hook_in_proj", "attn.hook_in", "hook_mixer_out",
                         "hook_attn_out", "hook_resid_pre", "hook_resid_mid")]))
    mod = "model.layers.1."
    ins, _ = _module_io(t.hf, ids, mod + "mamba.in_proj")
    _, proj = _module_io(t.hf, ids, mod + "mamba.in_proj")
    mup = t.hf.get_submodule(mod + "mamba").mup_vector
    q_in, _ = _module_io(t.hf, ids, mod + "self_attn.q_proj")
    _, mamba = _module_io(t.hf, ids, mod + "mamba")
    _, attn = _module_io(t.hf, ids, mod + "self_attn")
    for ours, theirs in ((cache[p + "ssm.hook_in"], ins), (cache[p + "attn.hook_in"], q_in),
                         (cache[p + "ssm.hook_in_proj"], proj * mup),
                         (cache[p + "hook_mixer_out"], mamba * c.ssm_out_multiplier),
                         (cache[p + "hook_attn_out"], attn * c.attention_out_multiplier)):
        assert (ours - theirs).abs().max().item() < 1e-5
    total = cache[p + "hook_resid_pre"] + cache[p + "hook_attn_out"] + cache[p + "hook_mixer_out"]
    assert (total - cache[p + "hook_resid_mid"]).abs().max().item() < 1e-5


def test_effective_attention_times_x_is_y_on_every_recurrent_layer(name) -> None:
    """Falcon-H1's Mamba-2: A @ x == ssm.hook_y per head. LFM2's convolution: A @ x ==
    conv.hook_y per channel, plus C * conv bias where the conv has one."""
    model = hybrid2_model(name)
    ids = ssm_ids(2, 13, seed=2)
    for i, kind in enumerate(HYBRID2_LAYER_TYPES[name]):
        if kind == "full_attention":
            continue
        if kind == "short_conv":
            n = f"blocks.{i}.conv."
            c = model.forward(ids, mi.HookSpec().capture_all(
                [n + "hook_effective_attn", n + "hook_y", n + "hook_x", n + "hook_C"]))
            a, y = c[n + "hook_effective_attn"], c[n + "hook_y"]
            assert a.shape == (2, model.hidden_size, 13, 13)
            ax = torch.einsum("bcts,bsc->btc", a, c[n + "hook_x"])
            bias = model.backend.w.layers[i].mixer.conv_b
            if bias is not None:
                ax = ax + c[n + "hook_C"] * bias
            assert a.triu(3).abs().max().item() == 0 and a.tril(-3).abs().max().item() == 0
        else:
            n = f"blocks.{i}.ssm."
            c = model.forward(ids, mi.HookSpec().capture_all(
                [n + "hook_effective_attn", n + "hook_y", n + "hook_conv"]))
            a, y = c[n + "hook_effective_attn"], c[n + "hook_y"]
            h, hd = y.shape[2], y.shape[3]
            x = c[n + "hook_conv"][..., :h * hd].unflatten(-1, (h, hd))
            ax = torch.einsum("bhts,bshp->bthp", a, x)
        assert (ax - y).abs().max().item() < 1e-5 * max(1.0, y.abs().max().item()), (i, kind)


#: (family, our point, transformers' module whose output the same change hits)
_SAME_MODULE = [
    ("falcon_h1", "blocks.0.ssm.hook_in_proj", "model.layers.0.mamba.in_proj"),
    ("falcon_h1", "blocks.0.hook_mixer_out", "model.layers.0.mamba.out_proj"),
    ("falcon_h1", "blocks.1.hook_attn_out", "model.layers.1.self_attn.o_proj"),
    ("falcon_h1", "blocks.1.attn.hook_v", "model.layers.1.self_attn.v_proj"),
    ("falcon_h1", "blocks.1.attn.hook_k", "model.layers.1.self_attn.k_proj"),
    ("falcon_h1_norm", "blocks.0.attn.hook_q", "model.layers.0.self_attn.q_proj"),
    ("falcon_h1_norm", "blocks.1.mlp.hook_post", "model.layers.1.feed_forward.down_proj"),
    ("lfm2", "blocks.0.conv.hook_in_proj", "model.layers.0.conv.in_proj"),
    ("lfm2", "blocks.1.hook_mixer_out", "model.layers.1.conv.out_proj"),
    ("lfm2", "blocks.2.hook_attn_out", "model.layers.2.self_attn.out_proj"),
]


@pytest.mark.parametrize("which, point, module", _SAME_MODULE)
def test_an_intervention_equals_transformers_with_a_hook_on_the_same_module(
        which: str, point: str, module: str) -> None:
    """Scaling is linear, so scaling our point equals scaling the module's output where the
    two differ by a multiplier (Falcon-H1's mup vector, key and out multipliers) or by the
    linear map after it (mlp.hook_post: down_proj's input, no bias)."""
    t, model = tiny_hybrid2(which), hybrid2_model(which)
    ids = ssm_ids(1, 10, seed=5)

    def scale(x: torch.Tensor, hook: Any = None) -> torch.Tensor:
        return x * 1.7

    ours = model.forward(ids, mi.HookSpec().intervene(point, scale)).output
    assert_matches_hf_with_hook(ours, t.hf, ids, t.hf.get_submodule(module),
                                lambda m, i, o: scale(o))


def test_state_specs_reach_the_recurrent_layers_and_refuse_an_attention_layer(name) -> None:
    model = hybrid2_model(name)
    types = HYBRID2_LAYER_TYPES[name]
    ids = ssm_ids(1, 9, seed=3)
    plain = model.forward(ids).output
    ko = model.forward(ids, mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec([2]))).output
    assert (ko - plain)[:, :2].abs().max().item() == 0  # causal: nothing before the write
    assert (ko - plain)[:, 2:].abs().max().item() > 1e-4
    if "full_attention" in types:  # LFM2's attention layers have no state
        attn = types.index("full_attention")
        with pytest.raises(mi.InterventionError, match=f"layer {attn} is a 'full_attention'"):
            model.forward(ids, mi.HookSpec().set_state_knockout(
                mi.StateKnockoutSpec([2]).layer(attn)))
    with pytest.raises(mi.InterventionError, match="heads"):  # channels / heads in range
        model.forward(ids, mi.HookSpec().set_state_knockout(
            mi.StateKnockoutSpec([2]).heads([10 ** 4])))


def _conv_reference(B: torch.Tensor, C: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                    bias: torch.Tensor | None, scale: torch.Tensor) -> torch.Tensor:
    """y_t = C_t * (sum_j w[K-1-j] * s_{t-j} * B_{t-j} x_{t-j} + bias), written out in
    float64 (s: the write scale of each token [t, channels])."""
    b, t, d = x.shape
    k = w.shape[-1]
    write = (B * x).double() * scale.double()
    y = torch.zeros(b, t, d, dtype=torch.float64)
    for ti in range(t):
        for j in range(k):
            if ti - j >= 0:
                y[:, ti] += w[:, 0, k - 1 - j].double() * write[:, ti - j]
    if bias is not None:
        y = y + bias.double()
    return y * C.double()


@pytest.mark.parametrize("which", ["lfm2", "lfm2_bias"])
def test_short_conv_state_specs_scale_the_write_of_their_tokens_and_channels(which) -> None:
    """Knockout of token 3 in channels 0..9 changes this layer's y at tokens 3..5 only (the
    window is 3), exactly as the convolution written out with that write scaled; steering
    (0.5 at token 6) likewise."""
    model = hybrid2_model(which)
    mix = model.backend.w.layers[0].mixer
    ids = ssm_ids(1, 10, seed=8)
    n = "blocks.0.conv."
    points = [n + "hook_B", n + "hook_C", n + "hook_x", n + "hook_y"]
    plain = model.forward(ids, mi.HookSpec().capture_all(points))
    chans = list(range(10))
    for spec, (pos, value) in ((mi.StateKnockoutSpec([3]).layer(0).heads(chans), (3, 0.0)),
                               (mi.StateSteeringSpec(0.5, [6], target_layers=[0],
                                                     target_heads=chans), (6, 0.5))):
        hooks = mi.HookSpec().capture_all(points)
        hooks = hooks.set_state_knockout(spec) if isinstance(spec, mi.StateKnockoutSpec) \
            else hooks.set_state_steering(spec)
        got = model.forward(ids, hooks)
        scale = torch.ones(10, model.hidden_size)
        scale[pos, chans] = value
        want = _conv_reference(got[n + "hook_B"], got[n + "hook_C"], got[n + "hook_x"],
                               mix.conv_w, mix.conv_b, scale)
        assert (got[n + "hook_y"].double() - want).abs().max().item() < 1e-5
        moved = (got[n + "hook_y"] - plain[n + "hook_y"]).abs().amax(dim=(0, 2))
        assert set(torch.nonzero(moved > 0).flatten().tolist()) == {pos, pos + 1, pos + 2}


def test_short_conv_windows_are_its_writes_and_an_edit_there_is_read() -> None:
    """conv.hook_state [b, s, d, 3]: at token t the writes B x of tokens t-2, t-1, t (zeros
    before the first); with padding each row's real tokens only (a padded row's windows at
    its real tokens equal the row alone's). Zeroing it leaves y = 0 (no conv bias); the
    carried window after a call is the last window's newest two writes."""
    model = hybrid2_model("lfm2")
    ids = ssm_ids(2, 9, seed=9)
    n = "blocks.0.conv."
    c = model.forward(ids, mi.HookSpec().capture_all([n + "hook_state", n + "hook_B",
                                                      n + "hook_x"]))
    win, write = c[n + "hook_state"], c[n + "hook_B"] * c[n + "hook_x"]
    padded = torch.cat([torch.zeros(2, 2, write.shape[-1]), write], dim=1)
    for k in range(3):
        assert (win[..., k] - padded[:, k:k + 9]).abs().max().item() == 0
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    wp = model.forward(ids, mi.HookSpec().capture(n + "hook_state"),
                       attention_mask=mask)[n + "hook_state"]
    alone = model.forward(ids[1:, 3:], mi.HookSpec().capture(n + "hook_state"))[n + "hook_state"]
    assert (wp[1, 3:] - alone[0]).abs().max().item() < 1e-6
    zero = model.forward(ids, mi.HookSpec().capture(n + "hook_y").intervene(
        n + "hook_state", lambda x, hook=None: torch.zeros_like(x)))
    assert zero[n + "hook_y"].abs().max().item() == 0
    for hooks in (mi.HookSpec(), mi.HookSpec().capture(n + "hook_state")):  # both paths
        past = model.backend.new_past(2)
        model.forward(ids, hooks, past=past)
        assert (past.states[0].conv - win[:, -1, :, 1:]).abs().max().item() == 0


@pytest.mark.parametrize("which", ["falcon_h1", "lfm2"])
def test_an_inplace_edit_at_any_point_equals_returning_it(which: str) -> None:
    """Hooks never alias (issue 20): at every point of a Falcon-H1 layer (both branches) and
    of LFM2's convolution (whose B, C, x are slices of in_proj's output), an in-place edit by a
    callable equals returning the edited tensor."""
    from tests.support.inplace import inplace_mismatches

    model = hybrid2_model(which)
    bad = inplace_mismatches(model, ssm_ids(2, 6, seed=1))
    assert not bad, "\n".join(bad)
