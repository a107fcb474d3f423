"""Gated DeltaNet's hook points, per-step states, effective attention and state specs
(Qwen3.5 / Qwen3-Next tiny checkpoints, tests/support/linear_tiny.py): the states against
transformers' cached recurrent state, ``A @ v == z``, and state knockout / steering against
a float64 token-by-token delta rule written out here from the captured q, k, v, beta and
decay (an independent reading of the semantics: the whole delta write of a token, the erase
along k and the add, is skipped or scaled)."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi

from tests.support.linear_tiny import linear_model, tiny_linear  # noqa: F401
from tests.support.ssm_tiny import ssm_ids

P = "blocks.0.attn."


def test_every_hook_point_has_its_documented_shape(linear_model) -> None:
    model = linear_model("qwen3_next")
    ids = ssm_ids(2, 6, seed=1)
    points = [p.name for p in model.hook_points()]
    for i in (0, 3):  # a gated DeltaNet layer and a gated attention layer
        mine = [p for p in points if p.startswith(f"blocks.{i}.")]
        cache = model.forward(ids, mi.HookSpec().capture_all(mine))
        for p in mine:
            want = model.backend.hook_shape(p, 2, 6)  # -1: any key length
            got = tuple(cache[p].shape)
            assert len(got) == len(want) and all(w in (-1, g) for g, w in zip(got, want)), \
                (p, got, want)
    assert f"{P}hook_state" in points and f"{P}hook_effective_attn" in points
    assert "blocks.0.hook_mixer_out" in points and "blocks.0.hook_attn_out" not in points
    assert "blocks.3.attn.hook_gate" in points and "blocks.3.attn.hook_pattern" in points
    assert model.backend.hook_shape(f"{P}hook_state", 2, 6) == (2, 6, 4, 8, 8)
    assert model.backend.hook_shape(f"{P}hook_q", 2, 6) == (2, 6, 2, 8)       # key heads
    assert model.backend.hook_shape("blocks.3.attn.hook_gate", 2, 6) == (2, 6, 4, 16)


def test_per_step_states_are_transformers_cached_state_after_each_prefix(
        tiny_linear, linear_model) -> None:
    t, model = tiny_linear("qwen3_5_text"), linear_model("qwen3_5_text")
    ids = ssm_ids(1, 9, seed=2)
    states = model.forward(ids, mi.HookSpec().capture(f"{P}hook_state"))[f"{P}hook_state"]
    for k in (1, 5, 9):
        with torch.no_grad():
            cache = t.hf(ids[:, :k], use_cache=True).past_key_values
        theirs = cache.layers[0].recurrent_states[0]                      # [b, h, d_k, d_v]
        assert (states[:, k - 1] - theirs).abs().max().item() < 1e-5, k
    # capturing the states (the exact recurrence) changes no output beyond F32 rounding
    plain = model.forward(ids).output
    assert (model.forward(ids, mi.HookSpec().capture(f"{P}hook_state")).output
            - plain).abs().max().item() < 1e-4


def test_effective_attention_times_v_is_z(linear_model) -> None:
    model = linear_model("qwen3_next")
    ids = ssm_ids(2, 12, seed=3)
    cache = model.forward(ids, mi.HookSpec().capture_all(
        [f"{P}hook_effective_attn", f"{P}hook_v", f"{P}hook_z"]))
    a, v, z = (cache[P + s] for s in ("hook_effective_attn", "hook_v", "hook_z"))
    assert (torch.einsum("bhts,bshv->bthv", a, v) - z).abs().max().item() < 1e-5
    assert a.triu(1).abs().max().item() == 0.0 and a.abs().max().item() > 1e-2


def naive_delta(inp: dict[str, torch.Tensor], scales: torch.Tensor) -> torch.Tensor:
    """z [T, H, d_v] of batch row 0 in float64: S = exp(g) S; S += s beta k (v - S^T k)^T;
    z = S^T q d_k^-1/2; `scales` [T, H] multiplies each token's delta write."""
    q, k, v, beta, g = (inp[n][0].double() for n in ("q", "k", "v", "beta", "decay"))
    h = v.shape[1]
    rep = h // q.shape[1]
    q, k = q.repeat_interleave(rep, 1) * q.shape[-1] ** -0.5, k.repeat_interleave(rep, 1)
    s = torch.zeros(h, k.shape[-1], v.shape[-1], dtype=torch.float64)
    out = []
    for t in range(v.shape[0]):
        s = s * g[t].exp()[:, None, None]
        delta = (v[t] - torch.einsum("hkv,hk->hv", s, k[t])) * (beta[t] * scales[t])[:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        out.append(torch.einsum("hkv,hk->hv", s, q[t]))
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["knockout", "steering", "both"])
def test_state_specs_skip_or_scale_the_delta_write_as_the_naive_rule(linear_model,
                                                                     kind: str) -> None:
    model = linear_model("qwen3_next")
    ids = ssm_ids(1, 12, seed=4)
    hooks, scales = mi.HookSpec(), torch.ones(12, 4, dtype=torch.float64)
    if kind in ("steering", "both"):
        hooks.set_state_steering(mi.StateSteeringSpec(2.5, positions=[2, 5]).heads([1, 3])
                                 .layer(0))
        scales[[2, 5], 1] = scales[[2, 5], 3] = 2.5
    if kind in ("knockout", "both"):
        hooks.set_state_knockout(mi.StateKnockoutSpec(positions=[5, -3]).layer(0))
        scales[[5, 9]] = 0.0  # knockout wins where both apply
    names = [P + f"hook_{n}" for n in ("q", "k", "v", "beta", "decay", "z")]
    cache = model.forward(ids, hooks.capture_all(names))
    inp = {n.split("hook_")[1]: cache[n] for n in names}
    assert (inp["z"][0].double() - naive_delta(inp, scales)).abs().max().item() < 1e-5
    plain = model.forward(ids, mi.HookSpec().capture(P + "hook_z"))[P + "hook_z"][0]
    assert (inp["z"][0, :2] - plain[:2]).abs().max().item() == 0.0
    assert (inp["z"][0, 5:] - plain[5:]).abs().max().item() > 1e-3


def test_state_specs_on_the_attention_layer_and_attention_knockout_on_deltanet_are_refused(
        linear_model) -> None:
    from mi_core.interp import KnockoutSpec, knockout_hooks

    model = linear_model("qwen3_next")
    with pytest.raises(mi.InterventionError, match=r"layer 3 is a 'full_attention' layer"):
        model.forward(ssm_ids(1, 6), mi.HookSpec().set_state_knockout(
            mi.StateKnockoutSpec(positions=[1]).layer(3)))
    with pytest.raises(mi.HookError, match=r"layer 0 is a 'gated_deltanet' layer"):
        knockout_hooks(model, KnockoutSpec(from_positions=[-1], to_positions=[0]), 5)
    # attention knockout on the attention layer only runs
    spec = KnockoutSpec(from_positions=[-1], to_positions=[0]).layer(3)
    out = model.forward(ssm_ids(1, 5), knockout_hooks(model, spec, 5)).output
    assert (out[0, -1] - model.forward(ssm_ids(1, 5)).output[0, -1]).abs().max().item() > 0


def test_the_attention_output_gate_point_changes_what_w_o_reads(linear_model) -> None:
    model = linear_model("qwen3_5_text")
    ids = ssm_ids(1, 6, seed=5)
    plain = model.forward(ids).output
    one = model.forward(ids, mi.HookSpec().intervene("blocks.3.attn.hook_gate", mi.Replace(
        torch.ones(1, 6, 4, 16)))).output
    assert (one - plain).abs().max().item() > 1e-3
