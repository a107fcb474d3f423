"""Safetensors headers of the wrong JSON shape, and fuzzed ones: a WeightLoadError naming the
file (and the entry), never a raw KeyError / TypeError / ValueError."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from mi_core.errors import MIError, WeightLoadError
from mi_core.loading import SafetensorsCheckpoint


def _write(path: Path, header: object, data: bytes = b"\0" * 64) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize("header, culprit", [
    ([1, 2, 3], "JSON object"),
    ({"w": [0, 4]}, "'w'"),
    ({"w": {"dtype": "F32", "shape": [1]}}, "'w'"),  # no data_offsets
    ({"w": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}}, "'w'"),
    ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "'w'"),
    ({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}}, "'w'"),
    ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, "'w'"),
    ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, True]}}, "'w'"),
    ({"__metadata__": {"format": 1}}, "__metadata__"),
])
def test_malformed_header_is_a_weight_load_error_naming_file_and_entry(tmp_path, header, culprit):
    f = _write(tmp_path / "m.safetensors", header)
    with pytest.raises(WeightLoadError) as e:
        SafetensorsCheckpoint([f])
    assert str(f) in str(e.value) and culprit in str(e.value)


def test_a_valid_file_still_loads(tmp_path):
    f = tmp_path / "ok.safetensors"
    save_file({"w": torch.arange(6.0).view(2, 3)}, f)
    assert torch.equal(SafetensorsCheckpoint([f]).get("w"), torch.arange(6.0).view(2, 3))


_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 100),
                               st.floats(allow_nan=False), st.text(max_size=4)),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)
_ENTRY = st.fixed_dictionaries({}, optional={
    "dtype": st.one_of(st.sampled_from(["F32", "F16", "I8", "BOOL", "X"]), _JSON),
    "shape": st.one_of(st.lists(st.integers(-1, 4), max_size=3), _JSON),
    "data_offsets": st.one_of(st.lists(st.integers(-1, 80), min_size=2, max_size=2), _JSON)})
_HEADER = st.one_of(_JSON, st.dictionaries(st.sampled_from(["a", "b", "__metadata__"]),
                                           st.one_of(_ENTRY, _JSON), max_size=3))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=_HEADER)
def test_fuzzed_headers_load_or_raise_an_mierror(tmp_path, header):
    f = _write(tmp_path / "fuzz.safetensors", header)
    try:
        ck = SafetensorsCheckpoint([f])
        for name in ck.names():
            ck.get(name, dtype=torch.float32)
    except MIError:
        pass
