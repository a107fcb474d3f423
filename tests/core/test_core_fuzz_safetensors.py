"""Property-based fuzzing of safetensors headers: random JSON of plausible shape, written as a
safetensors file. Reading it either works (and every tensor then has its declared shape and
dtype) or fails with an MIError naming the file; never a raw ValueError/KeyError/TypeError."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mi_core as mi
from mi_core.loading import SAFETENSORS_DTYPES, SafetensorsCheckpoint

_TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "I32": torch.int32, "U8": torch.uint8, "I8": torch.int8, "BOOL": torch.bool,
          "F64": torch.float64, "I16": torch.int16}

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(allow_nan=False),
                     st.text(max_size=4))
_ints = st.one_of(st.integers(-2, 12), st.booleans(), st.just("3"), st.floats(0, 4))
_dtype = st.one_of(st.sampled_from(sorted(_TORCH)), st.sampled_from(["F33", "", "f32", "C64"]),
                   _scalars)
_shape = st.one_of(st.lists(st.integers(0, 4), max_size=3), st.lists(_ints, max_size=3), _scalars)
_offsets = st.one_of(st.lists(st.integers(0, 64), min_size=2, max_size=2),
                     st.lists(_ints, max_size=3), _scalars)
_entry = st.one_of(
    st.fixed_dictionaries({"dtype": _dtype, "shape": _shape, "data_offsets": _offsets}),
    st.dictionaries(st.sampled_from(["dtype", "shape", "data_offsets", "x"]), _scalars,
                    max_size=3),
    _scalars, st.lists(_scalars, max_size=2))
_metadata = st.one_of(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
                      _scalars)
_header = st.one_of(
    st.dictionaries(st.sampled_from(["a", "b", "c", "w.weight"]), _entry, max_size=3),
    st.dictionaries(st.just("__metadata__"), _metadata, max_size=1),
    st.lists(_scalars, max_size=2), _scalars)


def _consistent(entries: list[tuple[str, str, list[int]]]) -> tuple[dict[str, Any], int]:
    """A valid header laid out contiguously (so that the fuzz also explores valid files)."""
    header, pos = {}, 0
    for name, dtype, shape in entries:
        n = SAFETENSORS_DTYPES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    return header, pos


_valid = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(sorted(_TORCH)),
                            st.lists(st.integers(0, 3), max_size=3)),
                  max_size=3, unique_by=lambda e: e[0]).map(_consistent)


def _read_all(path: Path) -> None:
    ckpt = SafetensorsCheckpoint([path])
    for name in ckpt.names():
        t = ckpt.get(name)
        meta = json.loads(path.read_bytes()[8:8 + struct.unpack("<Q", path.read_bytes()[:8])[0]])
        assert list(t.shape) == meta[name]["shape"] and t.dtype == _TORCH[meta[name]["dtype"]]


def _check(header: Any, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        raw = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
        try:
            _read_all(path)
        except mi.MIError as exc:
            assert str(path) in str(exc), f"the error does not name the file: {exc}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=_header, data=st.binary(max_size=64))
def test_random_safetensors_headers_load_or_raise_an_mi_error(header: Any, data: bytes) -> None:
    _check(header, data)


@settings(max_examples=100, deadline=None)
@given(valid=_valid, cut=st.integers(0, 8), extra=st.binary(max_size=4))
def test_valid_headers_load_and_truncated_ones_raise_an_mi_error(
        valid: tuple[dict[str, Any], int], cut: int, extra: bytes) -> None:
    header, size = valid
    data = bytes(size)
    _check(header, data[:max(0, size - cut)] + (extra if cut == 0 else b""))


def test_the_fuzz_reaches_both_outcomes() -> None:
    """Guard against a vacuous fuzz: a valid file loads, a broken one raises."""
    header, size = _consistent([("w", "F32", [2, 2])])
    _check(header, bytes(size))  # loads and shapes check out
    with pytest.raises(mi.WeightLoadError):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "x.safetensors"
            raw = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 3]}}).encode()
            path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))
            _read_all(path)
