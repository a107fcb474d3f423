"""MiniMax (lightning attention + softmax attention, MoE, the residual = alpha * norm output
arithmetic) against transformers on the same tiny weights (its CPU torch path,
tests/support/zamba2_minimax_tiny.py): logits and every layer's residual stream < 1e-4
(F32, and against transformers run in float64), a left-padded batch of 2 (transformers zeroes
the pads' q / k / v and the state starts at zero: padding-invariant on the left), cached
greedy generation, token by token == the sequence, per-step states == transformers' cached
linear state, ``A @ v == z``, state specs against a float64 token-by-token rule written out
here, hook shapes, the residual arithmetic at the hook points, bf16, and the decay buffers
checked at load."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

import mi_core as mi

from tests.support.hf_reference import assert_matches_hf_with_hook
from tests.support.zamba2_minimax_tiny import ZM_LAYER_TYPES, tiny_zm, zm_ids, zm_model

TOL = 1e-4
NAME = "minimax"
P = "blocks.0.attn."  # a lightning layer (layer 2 is softmax attention)


def test_logits_and_every_layers_residual_stream_match_transformers() -> None:
    """40 tokens: five of transformers' 8-token blocks, and our 64-token chunk."""
    t, model = tiny_zm(NAME), zm_model(NAME)
    ids = zm_ids(2, 40, seed=1)
    with torch.no_grad():
        ref = t.hf(ids, output_hidden_states=True)
        ref64 = copy.deepcopy(t.hf).double()
        ref64.config._experts_implementation = "eager"  # (float64 needs the eager experts)
        logits64 = ref64(ids).logits
    L = model.num_layers
    cache = model.forward(ids, mi.HookSpec().capture_all(mi.HookPoint.resid_pre(i)
                                                         for i in range(L)))
    assert (cache.output - ref.logits).abs().max().item() < TOL
    assert (cache.output.double() - logits64).abs().max().item() < TOL
    for i in range(L):  # hidden_states[i] = layer i's input
        diff = (cache[mi.HookPoint.resid_pre(i)] - ref.hidden_states[i]).abs().max().item()
        assert diff < TOL, (i, diff)
    assert cache.output.std().item() > 0.5  # unit scale: the comparison is not of zeros
    assert model.layer_types == ZM_LAYER_TYPES[NAME]


def test_left_padded_batch_matches_transformers_and_each_row_alone() -> None:
    t, model = tiny_zm(NAME), zm_model(NAME)
    ids = zm_ids(2, 14, seed=2)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ids[1, :5] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as transformers' generate passes them
    with torch.no_grad():
        ref = t.hf(ids, attention_mask=mask, position_ids=positions).logits
    out = model.forward(ids, attention_mask=mask).output
    assert (out[0] - ref[0]).abs().max().item() < TOL
    assert (out[1, 5:] - ref[1, 5:]).abs().max().item() < TOL
    alone = model.forward(ids[1:, 5:]).output
    assert (out[1, 5:] - alone[0]).abs().max().item() < TOL


def test_cached_greedy_generation_equals_transformers_tokens() -> None:
    t, model = tiny_zm(NAME), zm_model(NAME)
    ids = zm_ids(2, 9, seed=3)
    with torch.no_grad():  # transformers' MiniMaxCache: KV for attention, K^T V for lightning
        ref = t.hf.generate(ids, max_new_tokens=10, do_sample=False)
    out = model.generate(ids, max_new_tokens=10).tokens
    eos = t.hf.config.eos_token_id
    for row in range(2):
        gen, theirs = out[row, 9:].tolist(), ref[row, 9:].tolist()
        n = gen.index(eos) + 1 if eos in gen else len(gen)
        assert gen[:n] == theirs[:n], (row, gen, theirs)


def test_token_by_token_with_the_cache_equals_the_sequence() -> None:
    model = zm_model(NAME)
    ids = zm_ids(2, 11, seed=4)
    full = model.forward(ids).output
    past = model.backend.new_past(2)
    steps = [model.forward(ids[:, :4], past=past).output]
    steps += [model.forward(ids[:, j:j + 1], past=past).output for j in range(4, 11)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < TOL


def test_per_step_states_are_transformers_cached_linear_state_after_each_prefix() -> None:
    t, model = tiny_zm(NAME), zm_model(NAME)
    ids = zm_ids(1, 13, seed=5)
    states = model.forward(ids, mi.HookSpec().capture(f"{P}hook_state"))[f"{P}hook_state"]
    for k in (1, 8, 13):  # within, at the end of and past transformers' first block
        with torch.no_grad():
            cache = t.hf(ids[:, :k], use_cache=True).cache
        theirs = cache.linear_cache[0]                                   # [b, h, d_k, d_v]
        assert (states[:, k - 1] - theirs).abs().max().item() < 1e-5, k
    plain = model.forward(ids).output  # capturing states (the exact recurrence): same output
    assert (model.forward(ids, mi.HookSpec().capture(f"{P}hook_state")).output
            - plain).abs().max().item() < TOL


def test_effective_attention_times_v_is_z_on_every_lightning_layer() -> None:
    model = zm_model(NAME)
    ids = zm_ids(2, 12, seed=6)
    for i, kind in enumerate(ZM_LAYER_TYPES[NAME]):
        if kind != "lightning_attention":
            continue
        p = f"blocks.{i}.attn."
        cache = model.forward(ids, mi.HookSpec().capture_all(
            [p + "hook_effective_attn", p + "hook_v", p + "hook_z"]))
        a, v, z = (cache[p + s] for s in ("hook_effective_attn", "hook_v", "hook_z"))
        assert (torch.einsum("bhts,bshv->bthv", a, v) - z).abs().max().item() < 1e-5
        assert a.triu(1).abs().max().item() == 0.0 and a.abs().max().item() > 1e-2


def naive_lightning(inp: dict[str, torch.Tensor], scales: torch.Tensor) -> torch.Tensor:
    """z [T, H, d] of batch row 0 in float64: S = exp(g) S + s k v^T, z = S^T q, with the
    log-decay g = -slope and `scales` [T, H] multiplying each token's write."""
    q, k, v, g = (inp[n][0].double() for n in ("q", "k", "v", "decay"))
    s = torch.zeros(v.shape[1], k.shape[-1], v.shape[-1], dtype=torch.float64)
    out = []
    for t in range(v.shape[0]):
        s = s * g[t].exp()[:, None, None] + scales[t][:, None, None] * (
            k[t][:, :, None] * v[t][:, None, :])
        out.append(torch.einsum("hkv,hk->hv", s, q[t]))
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["knockout", "steering", "both"])
def test_state_specs_skip_or_scale_the_write_as_the_naive_rule(kind: str) -> None:
    model = zm_model(NAME)
    ids = zm_ids(1, 12, seed=7)
    hooks, scales = mi.HookSpec(), torch.ones(12, 4, dtype=torch.float64)
    if kind in ("steering", "both"):
        hooks.set_state_steering(mi.StateSteeringSpec(2.5, positions=[2, 5]).heads([1, 3])
                                 .layer(0))
        scales[[2, 5], 1] = scales[[2, 5], 3] = 2.5
    if kind in ("knockout", "both"):
        hooks.set_state_knockout(mi.StateKnockoutSpec(positions=[5, -3]).layer(0))
        scales[[5, 9]] = 0.0  # knockout wins where both apply
    names = [P + f"hook_{n}" for n in ("q", "k", "v", "decay", "z")]
    cache = model.forward(ids, hooks.capture_all(names))
    inp = {n.split("hook_")[1]: cache[n] for n in names}
    assert (inp["z"][0].double() - naive_lightning(inp, scales)).abs().max().item() < 1e-5
    plain = model.forward(ids, mi.HookSpec().capture(P + "hook_z"))[P + "hook_z"][0]
    assert (inp["z"][0, :2] - plain[:2]).abs().max().item() == 0.0
    assert (inp["z"][0, 5:] - plain[5:]).abs().max().item() > 1e-3


def test_every_hook_point_has_its_documented_shape_and_the_decay_is_the_slopes() -> None:
    t, model = tiny_zm(NAME), zm_model(NAME)
    ids = zm_ids(2, 6, seed=8)
    points = [p.name for p in model.hook_points()]
    for i in (0, 2):  # a lightning layer and a softmax-attention layer
        mine = [p for p in points if p.startswith(f"blocks.{i}.")]
        cache = model.forward(ids, mi.HookSpec().capture_all(mine))
        for p in mine:
            want = model.backend.hook_shape(p, 2, 6)  # -1: any key length
            got = tuple(cache[p].shape)
            assert len(got) == len(want) and all(w in (-1, g) for g, w in zip(got, want)), \
                (p, got, want)
    assert "blocks.0.hook_mixer_out" in points and "blocks.0.attn.hook_pattern" not in points
    assert "blocks.2.hook_attn_out" in points and "blocks.2.attn.hook_pattern" in points
    assert model.backend.hook_shape(f"{P}hook_state", 2, 6) == (2, 6, 4, 16, 16)
    decay = model.forward(ids, mi.HookSpec().capture(f"{P}hook_decay"))[f"{P}hook_decay"]
    slopes = t.hf.model.layers[0].self_attn.slope_rate.flatten()
    assert torch.equal(decay[0, 0], -slopes)


@pytest.mark.parametrize("layer", [0, 2])
def test_each_residual_is_alpha_times_the_norm_output_plus_the_branch(layer: int) -> None:
    """MiniMax: x = alpha * ln1(x) + beta * f(ln1(x)); hook_attn_out / hook_mixer_out /
    hook_mlp_out are the branches after beta (what is added)."""
    model = zm_model(NAME)
    cfg = json.loads((tiny_zm(NAME).path / "config.json").read_text())
    kind = "linear_attn" if layer == 0 else "full_attn"
    out = "hook_mixer_out" if layer == 0 else "hook_attn_out"
    p = f"blocks.{layer}."
    names = [p + n for n in ("attn.hook_in", out, "hook_resid_mid", "mlp.hook_in",
                             "hook_mlp_out", "hook_resid_post")]
    c = model.forward(zm_ids(1, 7, seed=9), mi.HookSpec().capture_all(names))
    mid = cfg[f"{kind}_alpha_factor"] * c[p + "attn.hook_in"] + c[p + out]
    assert (mid - c[p + "hook_resid_mid"]).abs().max().item() < 1e-5
    post = cfg["mlp_alpha_factor"] * c[p + "mlp.hook_in"] + c[p + "hook_mlp_out"]
    assert (post - c[p + "hook_resid_post"]).abs().max().item() < 1e-5


@pytest.mark.parametrize("point, module", [
    ("blocks.0.attn.hook_v", None), ("blocks.0.hook_mixer_out", "model.layers.0.self_attn"),
    ("blocks.2.hook_attn_out", "model.layers.2.self_attn"),
    ("blocks.1.hook_mlp_out", "model.layers.1.mlp")])
def test_an_intervention_equals_transformers_with_a_hook_on_the_same_module(
        point: str, module: str | None) -> None:
    t, model = tiny_zm(NAME), zm_model(NAME)
    ids = zm_ids(1, 10, seed=10)

    def scale(x: torch.Tensor, hook=None) -> torch.Tensor:
        if module is None:  # one head's values (all of them: the RMS norm would undo it)
            x = x.clone()
            x[:, :, 1] *= 1.7
            return x
        return x * 1.7

    ours = model.forward(ids, mi.HookSpec().intervene(point, scale)).output
    if module is None:  # v is the last third of each head's activated qkv_proj rows
        target = t.hf.get_submodule("model.layers.0.self_attn.act_fn")

        def edit(m, i, o):
            o = o.view(*o.shape[:2], 4, 3, 16).clone()
            o[:, :, 1, 2] *= 1.7
            return o.flatten(2)
        assert_matches_hf_with_hook(ours, t.hf, ids, target, edit)
        return
    # (a module's output before its residual: scaling either is the same linear change)
    assert_matches_hf_with_hook(ours, t.hf, ids, t.hf.get_submodule(module),
                                lambda m, i, o: (scale(o[0]),) + tuple(o[1:])
                                if isinstance(o, tuple) else scale(o))


def test_bfloat16_is_no_worse_than_transformers_in_bfloat16() -> None:
    """Against our F32 logits, our bf16 logits are as close as transformers' own bf16 forward
    (mean within 10%, max within 2x); our scan runs in F32, transformers' in bf16."""
    from transformers import AutoModelForCausalLM

    t = tiny_zm(NAME)
    ids = zm_ids(2, 24, seed=11)
    exact = zm_model(NAME).forward(ids).output
    hf = AutoModelForCausalLM.from_pretrained(t.path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        theirs = (hf(ids).logits.float() - exact).abs()
    ours = (mi.MIModel.from_pretrained(t.path, dtype=torch.bfloat16).forward(ids).output.float()
            - exact).abs()
    assert ours.mean().item() <= 1.1 * theirs.mean().item() + 1e-4, (ours.mean(), theirs.mean())
    assert ours.max().item() <= 2 * theirs.max().item() + 1e-3


def test_decay_buffers_that_are_not_the_slopes_are_refused(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    src = tiny_zm(NAME).path
    d = tmp_path / "bad"
    shutil.copytree(src, d)
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.3.self_attn.query_decay"] = \
        tensors["model.layers.3.self_attn.query_decay"] * 0.5
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(mi.WeightLoadError, match="layer 3: lightning attention's query_decay"):
        mi.MIModel.from_pretrained(d)


def test_weights_a_lightning_layer_lacks_are_typed_refusals() -> None:
    """(the MoE check used to read the attention of a layer that has none: AttributeError)"""
    be = zm_model(NAME).backend
    with pytest.raises(mi.WeightLoadError, match="'lightning_attention' layer without attention"):
        be.get_weight("W_Q", 0)
    with pytest.raises(mi.WeightLoadError, match="mixture-of-experts MLP: W_out is per expert"):
        be.get_weight("W_out", 0)
    assert be.get_weight("W_Q", 2).shape == (4, 32, 16)  # the attention layer's
