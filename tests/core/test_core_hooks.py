"""HookPoint naming, HookSpec bookkeeping and validation, HookCache access."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi


def test_hookpoint_parse_and_format_round_trip() -> None:
    hp = mi.HookPoint.parse("blocks.5.attn.hook_pattern")
    assert str(hp) == "blocks.5.attn.hook_pattern"
    assert hp.layer == 5 and not hp.is_custom
    assert hp == mi.HookPoint.attn_pattern(5)
    assert mi.HookPoint.resid_post(10).name == "blocks.10.hook_resid_post"
    assert mi.HookPoint.embed().name == "hook_embed"


def test_aliases_resolve_to_canonical_names() -> None:
    assert mi.HookPoint.parse("blocks.2.attn.hook_scores") == mi.HookPoint.attn_scores(2)
    assert mi.HookPoint.parse("hook_final_norm") == mi.HookPoint.final_norm()
    assert str(mi.HookPoint.final_norm()) == "ln_final.hook_normalized"


def test_unknown_names_are_custom_points_kept_verbatim() -> None:
    hp = mi.HookPoint.parse("my.backend.thing")
    assert hp.is_custom and str(hp) == "my.backend.thing" and hp.layer is None
    assert mi.HookPoint.parse("blocks.3.my_thing").is_custom


def test_hookspec_queries_and_chaining() -> None:
    spec = mi.HookSpec().capture("blocks.0.hook_resid_post").capture(mi.HookPoint.embed())
    spec.intervene("blocks.1.hook_resid_pre", mi.Zero()).intervene("blocks.1.hook_resid_pre", mi.Scale(2.0))
    assert not spec.is_empty()
    assert spec.num_captures() == 2 and spec.num_interventions() == 2
    assert spec.is_captured("hook_embed") and not spec.is_captured("blocks.1.hook_resid_pre")
    assert spec.has_intervention_at(mi.HookPoint.resid_pre(1))
    assert mi.HookSpec().is_empty()


def test_extend_appends_interventions_after_existing_ones() -> None:
    a = mi.HookSpec().intervene("hook_embed", mi.Scale(2.0))
    b = mi.HookSpec().intervene("hook_embed", mi.Zero()).capture("blocks.0.hook_resid_post")
    a.extend(b)
    kinds = [type(iv).__name__ for iv in a.interventions_at("hook_embed")]
    assert kinds == ["Scale", "Zero"] and a.is_captured("blocks.0.hook_resid_post")


def test_intervene_rejects_non_callables() -> None:
    with pytest.raises(mi.InterventionError, match="hook_embed"):
        mi.HookSpec().intervene("hook_embed", 3.0)  # type: ignore[arg-type]


def test_unknown_point_error_names_point_and_nearest(toy_model: mi.MIModel, ids: torch.Tensor) -> None:
    spec = mi.HookSpec().capture("blocks.1.hook_resid_postt")
    with pytest.raises(mi.HookError, match=r"blocks\.1\.hook_resid_postt.*nearest: blocks\.1\.hook_resid_post"):
        toy_model.forward(ids, spec)


def test_layer_out_of_range_error_names_valid_range(toy_model: mi.MIModel, ids: torch.Tensor) -> None:
    with pytest.raises(mi.HookError, match=r"layer 7 out of range; valid layers are 0\.\.2"):
        toy_model.forward(ids, mi.HookSpec().capture("blocks.7.hook_resid_post"))


def test_point_the_backend_lacks_is_an_error_not_a_silent_noop(toy_model: mi.MIModel,
                                                               ids: torch.Tensor) -> None:
    with pytest.raises(mi.HookError, match="attn.hook_pattern"):
        toy_model.forward(ids, mi.HookSpec().intervene("blocks.0.attn.hook_pattern", mi.Zero()))


def test_cache_access(toy_model: mi.MIModel, ids: torch.Tensor) -> None:
    cache = toy_model.forward(ids, mi.HookSpec().capture("blocks.0.hook_resid_post"))
    assert cache.output.shape == (2, 5, 11)
    assert len(cache) == 1 and "blocks.0.hook_resid_post" in cache
    assert cache.keys() == ["blocks.0.hook_resid_post"]
    assert cache.get("hook_embed") is None
    assert cache[mi.HookPoint.resid_post(0)].shape == (2, 5, 8)
    with pytest.raises(mi.HookError, match="hook_embed.*was not captured"):
        cache.require("hook_embed")
