"""State knockout and steering (the core's StateKnockoutSpec / StateSteeringSpec) on Mamba and
Mamba-2, against a float64 token-by-token recurrence written out here from the captured scan
inputs and transformers' A_log / D (an independent reference of the semantics: the write
``dt_s B_s x_s`` of the chosen positions and heads is skipped or scaled)."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.interp import run_state_knockout, run_state_steering

from tests.support.ssm_tiny import ssm_ids


def _scan_inputs(model: mi.MIModel, ids: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    n = f"blocks.{layer}.ssm."
    pts = [n + s for s in ("hook_conv", "hook_dt", "hook_B", "hook_C", "hook_y")]
    return {p.split("hook_")[1]: t for p, t in model.forward(ids, mi.HookSpec().capture_all(pts))
            .items() if p in pts}


def naive_y(inp: dict[str, torch.Tensor], a_log: torch.Tensor, d: torch.Tensor,
            scales: torch.Tensor) -> torch.Tensor:
    """y [T, H, P] of batch row 0 in float64: per head, S = exp(dt A) S + scale dt x B^T,
    y = S C + D x. `scales` [T, H] multiplies each write. Mamba-1 (A_log [d_inner, N]): heads
    are the channels (head_dim 1); Mamba-2 (A_log [H]): B / C shared by each group."""
    dt, B, C = (inp[k][0].double() for k in ("dt", "B", "C"))       # [T, H], [T, G, N]
    t, h = dt.shape
    x = inp["conv"][0, :, :h * (inp["y"].shape[-1])].double().view(t, h, -1)  # [T, H, P]
    A = -torch.exp(a_log.double())
    per = h // B.shape[1]
    B, C = B.repeat_interleave(per, dim=1), C.repeat_interleave(per, dim=1)  # [T, H, N]
    decay = torch.exp(dt[..., None] * (A if A.dim() == 2 else A[:, None]))   # [T, H, N]
    s = torch.zeros(h, x.shape[-1], B.shape[-1], dtype=torch.float64)
    ys = []
    for i in range(t):
        s = decay[i][:, None, :] * s + (scales[i, :, None, None] * dt[i][:, None, None]
                                        * x[i][:, :, None] * B[i][:, None, :])
        ys.append((s * C[i][:, None, :]).sum(-1) + d.double()[:, None] * x[i])
    return torch.stack(ys)


def _weights(tiny, family: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    mixer = tiny(family).hf.backbone.layers[layer].mixer
    return mixer.A_log.detach(), mixer.D.detach()


@pytest.mark.parametrize("kind", ["knockout", "steering", "both"])
def test_state_specs_skip_or_scale_the_write_as_the_naive_recurrence(
        family, tiny_ssm, ssm_model, kind: str) -> None:
    model = ssm_model(family)
    ids = ssm_ids(1, 12, seed=11)
    heads = model.num_heads
    hooks = mi.HookSpec()
    scales = torch.ones(12, heads, dtype=torch.float64)
    if kind in ("steering", "both"):
        hooks.set_state_steering(mi.StateSteeringSpec(2.5, positions=[2, 5]).heads([1, 3])
                                 .layer(0))
        scales[[2, 5], 1] = scales[[2, 5], 3] = 2.5
    if kind in ("knockout", "both"):
        hooks.set_state_knockout(mi.StateKnockoutSpec(positions=[5, -3]).layer(0))
        scales[[5, 9]] = 0.0  # knockout wins where both apply
    hooks.capture("blocks.0.ssm.hook_y")
    y = model.forward(ids, hooks)["blocks.0.ssm.hook_y"][0]
    ref = naive_y(_scan_inputs(model, ids, 0), *_weights(tiny_ssm, family, 0), scales)
    assert (y.double() - ref).abs().max().item() < 1e-5
    plain = _scan_inputs(model, ids, 0)["y"][0]
    assert (y[:2] - plain[:2]).abs().max().item() == 0.0       # before the first position
    assert (y[6:] - plain[6:]).abs().max().item() > 1e-3       # later ones really change


def test_knockout_zeroes_the_column_of_effective_attention_and_keeps_a_x_equal_y(
        ssm_model) -> None:
    model = ssm_model("mamba2")
    ids = ssm_ids(1, 10, seed=12)
    n = "blocks.1.ssm."
    hooks = mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec(positions=[4]).heads([0, 5]))
    cache = model.forward(ids, hooks.capture_all([n + "hook_effective_attn", n + "hook_y",
                                                  n + "hook_conv"]))
    a, y = cache[n + "hook_effective_attn"][0], cache[n + "hook_y"][0]
    assert a[[0, 5], 5:, 4].abs().max().item() == 0.0            # knocked-out heads
    assert a[[1, 2], 5:, 4].abs().min().item() > 0.0             # the others keep the column
    x = cache[n + "hook_conv"][0, :, :64].view(10, 8, 8).float()
    assert (torch.einsum("hts,shp->thp", a, x) - y).abs().max().item() < 1e-5


def test_positions_are_absolute_across_calls_that_share_the_state(family, ssm_model) -> None:
    model = ssm_model(family)
    ids = ssm_ids(1, 10, seed=13)
    spec = mi.StateKnockoutSpec(positions=[6])
    once = model.forward(ids, mi.HookSpec().set_state_knockout(spec)).output
    past = model.backend.new_past(1)
    model.forward(ids[:, :4], mi.HookSpec().set_state_knockout(spec), past=past)
    rest = model.forward(ids[:, 4:], mi.HookSpec().set_state_knockout(spec), past=past).output
    assert (rest - once[:, 4:]).abs().max().item() < 1e-4


def test_the_state_analyses_run_on_ssm_models(ssm_model) -> None:
    model = ssm_model("mamba")
    ids = ssm_ids(1, 9, seed=14)
    ko = run_state_knockout(model, ids, mi.StateKnockoutSpec(positions=[3]))
    assert ko.kl_divergence() > 0 and ko.kl_per_position()[:3].abs().max() == 0
    st = run_state_steering(model, ids, mi.StateSteeringSpec(1.0, positions=[3]))
    assert st.max_abs_logit_diff() == 0.0  # scale 1 is a no-op


@pytest.mark.parametrize("spec, match", [
    (mi.StateKnockoutSpec(positions=[1]).heads([8]), r"heads \[8\] out of range.*0\.\.7"),
    (mi.StateKnockoutSpec(positions=[1]).layer(5), "layer 5 out of range"),
    (mi.StateKnockoutSpec(positions=[1]).heads([-1]), r"heads \[-1\] must be >= 0"),
    (mi.StateKnockoutSpec(positions=[40]), "position 40 out of range"),
])
def test_a_bad_state_spec_is_refused_before_compute(ssm_model, spec, match: str) -> None:
    with pytest.raises(mi.InterventionError, match=match):
        ssm_model("mamba2").forward(ssm_ids(1, 6), mi.HookSpec().set_state_knockout(spec))
