"""Fuzzed GGUF metadata: any value of any GGUF type at an architecture's keys either loads
or raises an MIError (never a TypeError / KeyError / IndexError from deep inside a mapping).
One property, shared by the GGUF tests of every architecture group."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable

from mi_core.errors import MIError


def metadata_values() -> Any:
    """A hypothesis strategy of (value, GGUF type name) pairs of every scalar type, strings
    and integer arrays, including NaN / inf and out-of-range integers."""
    from hypothesis import strategies as st

    return st.one_of(
        st.tuples(st.integers(-2**31, 2**31 - 1), st.just("INT32")),
        st.tuples(st.integers(0, 2**32 - 1), st.just("UINT32")),
        st.tuples(st.floats(allow_nan=True, allow_infinity=True, width=32), st.just("FLOAT32")),
        st.tuples(st.booleans(), st.just("BOOL")),
        st.tuples(st.text(max_size=8), st.just("STRING")),
        st.tuples(st.lists(st.integers(0, 100), min_size=1, max_size=4), st.just("ARRAY")))


def fuzz_metadata(keys: list[str], write: Callable[[Path, dict[str, Any]], Path],
                  read: Callable[[Path], Any], root: Path, examples: int = 25) -> None:
    """`examples` files, each `write(path, {key: (value, type)})` with one of `keys` set to a
    fuzzed value, must `read` or raise an MIError."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    assert keys, "no metadata keys to fuzz"
    counter = itertools.count()

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(key=st.sampled_from(keys), value=metadata_values())
    def check(key: str, value: tuple[Any, str]) -> None:
        path = write(root / f"f{next(counter)}.gguf", {key: value})
        try:
            read(path)
        except MIError:
            pass

    check()
