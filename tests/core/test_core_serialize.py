"""Results and configs round-trip through JSON with cattrs."""

from __future__ import annotations

import attrs
import torch

import mi_core as mi


@attrs.define
class _Result:
    name: str
    values: torch.Tensor
    report: mi.CompatibilityReport


def test_attrs_result_with_tensor_and_nested_classes_round_trips() -> None:
    rep = mi.CompatibilityReport(source="x", model_type="llama", supported=True, backend="t",
                                 detections=[mi.Detection("t", 0.9, "ok", missing=["a"])])
    r = _Result("r", torch.tensor([[1.0, 2.0]]), rep)
    back = mi.from_json(mi.to_json(r), _Result)
    assert back.name == "r" and torch.equal(back.values, r.values)
    assert back.report == rep


def test_state_specs_round_trip(tmp_path) -> None:
    spec = mi.StateSteeringSpec(2.0).position(0).layer_range(1, 3)
    path = tmp_path / "spec.json"
    mi.to_json(spec, path)
    assert mi.from_json(path, mi.StateSteeringSpec) == spec
    assert spec.target_layers == [1, 2, 3] and spec.applies_to(2) and not spec.applies_to(0)
