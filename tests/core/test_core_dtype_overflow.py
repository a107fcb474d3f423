"""Intervention operands never overflow silently: an operand finite in its own dtype but not
in the activation's (``Replace(1e5)`` on float16, a float64 ``Add(1e300)`` on float32) is an
InterventionError naming the point, the dtype and the largest magnitude, raised when the
forward applies it; checked once per operand and dtype, never again per forward."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.hooks import HookPoint
from mi_core.interventions import apply_intervention, prepare


@pytest.fixture()
def half_toy(toy_dir) -> mi.MIModel:
    return mi.MIModel.from_pretrained(toy_dir, dtype=torch.float16)


def _refused(match: str):
    return pytest.raises(mi.InterventionError, match=match)


@pytest.mark.parametrize("iv, big", [
    (lambda: mi.Replace(1e5), "1e\\+05"),
    (lambda: mi.Add(torch.full((8,), 7e4)), "7e\\+04"),
    (lambda: mi.Add(torch.tensor([1.0, -3e38, 2.0], dtype=torch.float32)[1:2]), "3e\\+38"),
    (lambda: mi.Scale(torch.tensor(1e6)), "1e\\+06"),
    (lambda: mi.Scale(1e5), "1e\\+05"),
    (lambda: mi.Add(torch.tensor(100000)), "1e\\+05"),  # an integer operand, too
], ids=["replace", "add_vector", "add_slice", "scale_tensor", "scale_number", "add_int"])
def test_an_operand_beyond_float16_is_refused_naming_point_dtype_magnitude(half_toy, ids, iv,
                                                                           big) -> None:
    spec = mi.HookSpec().intervene("blocks.1.hook_resid_pre", iv())
    with _refused(rf"blocks\.1\.hook_resid_pre.*{big}.*torch\.float16.*65504"):
        half_toy.forward(ids, spec)


def test_the_issues_case_gives_an_error_not_inf_logits(half_toy, ids) -> None:
    """Before: Replace(1e5) on a float16 model passed construction and made logits inf."""
    with _refused("float16"):
        half_toy.forward(ids, mi.HookSpec().intervene("blocks.0.hook_mlp_out", mi.Replace(1e5)))
    fine = half_toy.forward(ids, mi.HookSpec().intervene("blocks.0.hook_mlp_out",
                                                         mi.Replace(1e3)))
    assert bool(torch.isfinite(fine.output).all())


def test_a_float64_operand_beyond_float32_is_refused(toy_model, ids) -> None:
    big = mi.Add(torch.tensor(1e300, dtype=torch.float64))  # finite where it was built
    with _refused(r"Add at hook_embed.*1e\+300.*torch\.float32"):
        toy_model.forward(ids, mi.HookSpec().intervene("hook_embed", big))
    ok = mi.Add(torch.tensor(1e30, dtype=torch.float64))
    assert bool(torch.isfinite(toy_model.forward(ids, mi.HookSpec().intervene(
        "hook_embed", ok)).output).all())


def test_operands_that_fit_and_masks_still_pass_in_half_precision() -> None:
    x = torch.zeros(1, 2, 3, 3, dtype=torch.float16)
    hp = HookPoint.parse("blocks.0.attn.hook_attn_scores")
    mask = torch.zeros(3, 3)
    mask[2, 0] = float("-inf")  # -inf is not finite before the cast either: no overflow
    for iv in (mi.Knockout(mask), mi.Replace(mask), mi.Add(torch.tensor(65504.0)),
               mi.Scale(65504.0), mi.Zero()):
        apply_intervention(hp, prepare(hp, iv), x)


def test_steer_scale_and_value_are_checked_in_the_activation_dtype() -> None:
    x = torch.full((1, 1, 2, 2), 0.5, dtype=torch.float16)
    hp = HookPoint.parse("blocks.0.attn.hook_pattern")
    mask = torch.tensor([[True, False], [False, True]])
    with _refused("Steer at blocks.0.attn.hook_pattern.*1e\\+05.*float16"):
        apply_intervention(hp, mi.Steer(mask, value=1e5), x)
    with _refused("Steer.*2e\\+05"):
        apply_intervention(hp, mi.Steer(mask, scale=2e5), x)
    apply_intervention(hp, mi.Steer(mask, scale=3.0), x)


def test_a_callable_result_that_overflows_the_cast_is_refused(half_toy, ids) -> None:
    def widen(t: torch.Tensor) -> torch.Tensor:
        return t.float() * 0 + 1e6  # float32, cast back to float16 by the hook: inf

    with _refused(r"the result of CallableIntervention\(.*widen\) at hook_embed.*float16"):
        half_toy.forward(ids, mi.HookSpec().intervene("hook_embed", widen))


def test_the_check_runs_once_per_operand_and_dtype(half_toy, ids, monkeypatch) -> None:
    """The second forward with the same operand checks nothing (no isfinite call)."""
    spec = mi.HookSpec().intervene("blocks.0.hook_resid_pre", mi.Add(torch.full((8,), 2.0)))
    half_toy.forward(ids, spec)
    calls = []
    real = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: calls.append(1) or real(t))
    half_toy.forward(ids, spec)
    assert calls == []


def test_an_operand_edited_in_place_after_a_check_is_checked_again(half_toy, ids) -> None:
    value = torch.full((8,), 2.0)
    spec = mi.HookSpec().intervene("blocks.0.hook_resid_pre", mi.Add(value))
    half_toy.forward(ids, spec)
    value.fill_(1e6)  # its version counter moves: the cached check no longer applies
    with _refused("1e\\+06"):
        half_toy.forward(ids, spec)


def test_the_cli_reports_an_overflow_as_mi_error(monkeypatch, capsys) -> None:
    """``mi steer --strengths 1e39``: a scale beyond float32 is one ``mi: error:`` line."""
    from mi_cli import models
    from mi_cli.main import main
    from tests.support.fake_backend import fake_model

    model = fake_model()
    monkeypatch.setattr(models, "load_model", lambda *a, **k: model)
    code = main(["steer", "--strengths", "1,1e39"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the progress line of the first strength
    assert code == 1 and last.startswith("mi: error: Steer at blocks."), err
    assert "torch.float32" in last and "1e+39" in last and "Traceback" not in err
