"""Placement arguments of ``from_pretrained(device_map=, max_memory=, offload=)``.

:func:`check_placement` validates them before anything is read (an :class:`~mi_core.InputError`
naming the part, range, device or size) into a :class:`Placement` the backend's loader
receives (``load(source, device, dtype, placement=...)``); the backend turns it into a
device per part from its own sizes (docs/BACKENDS.md, "Placement").
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import attrs
import torch

from mi_core.errors import InputError
from mi_core.inputs import resolve_device

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_RANGE = re.compile(r"blocks\.(\d+)(?:-(\d+))?")


@attrs.frozen
class Placement:
    """Checked placement arguments. `parts`: an explicit map as (first layer, last layer,
    device) ranges plus "embed" / "unembed" entries (layer None); empty for "auto" /
    "sequential"."""

    mode: str  # "map", "auto", "sequential", "none" (offload only)
    device: torch.device
    parts: tuple[tuple[str, int | None, int | None, torch.device], ...] = ()
    max_memory: tuple[tuple[torch.device, int], ...] = ()
    offload: str | None = None


def check_placement(device_map: Any, max_memory: Any, offload: Any, device: torch.device
                    ) -> Placement | None:
    """The placement arguments checked (None: a plain single-device load)."""
    if offload not in (None, "cpu", "disk"):
        raise InputError(f"offload must be None, 'cpu' or 'disk', got {offload!r}")
    budgets = _budgets(max_memory)
    if device_map is None:
        if budgets:
            raise InputError("max_memory needs device_map='auto' or 'sequential'")
        return Placement("none", device, offload=offload) if offload else None
    if device_map in ("auto", "sequential"):
        return Placement(device_map, device, (), budgets, offload)
    if not isinstance(device_map, Mapping) or not device_map:
        raise InputError(f"device_map must be 'auto', 'sequential' or a non-empty dict of part "
                         f"-> device, got {device_map!r}")
    parts = []
    for name, dev in device_map.items():
        m = _RANGE.fullmatch(name) if isinstance(name, str) else None
        if name not in ("embed", "unembed") and m is None:
            raise InputError(f"device_map part {name!r} is not one of 'embed', 'unembed', "
                             f"'blocks.N', 'blocks.A-B'")
        lo, hi = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (None, None)
        if lo is not None and hi < lo:  # type: ignore[operator]
            raise InputError(f"device_map part {name!r}: the range is reversed")
        for other, olo, ohi, _ in parts:
            if lo is not None and olo is not None and lo <= ohi and olo <= hi:
                raise InputError(f"device_map parts {other!r} and {name!r} overlap")
        parts.append((name, lo, hi, _device(dev, f"device_map part {name!r}")))
    if budgets:
        raise InputError("max_memory applies to device_map='auto' / 'sequential', not a map")
    return Placement("map", device, tuple(parts), (), offload)


def _device(dev: Any, what: str) -> torch.device:
    if isinstance(dev, int) and not isinstance(dev, bool):
        dev = f"cuda:{dev}"  # accelerate's spelling of a GPU index
    try:
        return resolve_device(dev)
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None


def _budgets(max_memory: Any) -> tuple[tuple[torch.device, int], ...]:
    if max_memory is None:
        return ()
    if not isinstance(max_memory, Mapping) or not max_memory:
        raise InputError(f"max_memory must be a dict of device -> bytes, got {max_memory!r}")
    out = []
    for dev, size in max_memory.items():
        d = _device(dev, f"max_memory key {dev!r}")
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*", str(size).upper()) \
            if isinstance(size, (int, str)) and not isinstance(size, bool) else None
        if m is None:
            raise InputError(f"max_memory[{dev!r}] must be bytes (int) or a size like '8GiB', "
                             f"got {size!r}")
        out.append((d, int(float(m.group(1)) * _UNITS[m.group(2) or ""])))
    return tuple(out)
