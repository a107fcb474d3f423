"""The transformer backend's placement engine: a device per part from the parts' sizes.

:func:`layout` turns the kernel's checked :class:`~mi_core.plugin.Placement` into a
:class:`Layout`: the device of the embedding, of each block and of the unembedding, and where
the blocks' weights rest between forwards (`offload`). Weights are plain tensors, not
``nn.Module``s, so accelerate's ``infer_auto_device_map`` (which walks a module tree) does
not apply; the same greedy fill is a few lines here. Free memory is read as accelerate reads
it (``torch.cuda.mem_get_info``, 90% of it; the CPU's MemAvailable).
"""

from __future__ import annotations

from typing import Mapping

import attrs
import torch

from mi_core.plugin import InputError, Placement


@attrs.frozen
class Layout:
    """Where each part lives: `layers[i]` is block i's compute device; `offload` (None,
    "cpu", "disk") says where the blocks' weights rest between forwards."""

    embed: torch.device
    layers: tuple[torch.device, ...]
    unembed: torch.device
    offload: str | None = None

    @classmethod
    def single(cls, device: torch.device, num_layers: int) -> "Layout":
        return cls(device, (device,) * num_layers, device)

    @property
    def placed(self) -> bool:
        """Anything but every part resident on one device."""
        return self.offload is not None or len({self.embed, self.unembed, *self.layers}) > 1


def layout(placement: Placement, layer_sizes: list[int], embed_size: int, unembed_size: int
           ) -> Layout:
    """The layout for a model of these parts (bytes as loaded); InputError when a map
    leaves a block out or names one past the model, or when the parts do not fit. Devices
    are spelled as tensors report them ("cpu", "cuda:0"), so a part is moved only when it
    really changes device."""
    n = len(layer_sizes)
    if placement.mode == "none":
        got = attrs.evolve(Layout.single(placement.device, n), offload=placement.offload)
    elif placement.mode == "map":
        got = _mapped(placement, n)
    else:
        got = _filled(placement, layer_sizes, embed_size, unembed_size)
    return Layout(canonical(got.embed), tuple(canonical(d) for d in got.layers),
                  canonical(got.unembed), got.offload)


def canonical(device: torch.device) -> torch.device:
    """The device as a tensor on it reports it: "cpu:0" is "cpu", "cuda" the current GPU."""
    if device.type == "cpu":
        return torch.device("cpu")
    if device.index is None and device.type == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _mapped(placement: Placement, n: int) -> Layout:
    found = {name: dev for name, lo, _, dev in placement.parts if lo is None}
    layers: list[torch.device | None] = [None] * n
    for name, lo, hi, dev in placement.parts:
        if lo is None or hi is None:
            continue
        if hi >= n:
            raise InputError(f"device_map part {name!r}: the model has blocks 0..{n - 1}")
        layers[lo:hi + 1] = [dev] * (hi - lo + 1)
    missing = [i for i, d in enumerate(layers) if d is None]
    if missing:
        raise InputError(f"device_map places no device for blocks {missing[:8]} (the model "
                         f"has blocks 0..{n - 1}); give every block a range")
    full = [d for d in layers if d is not None]
    embed = found.get("embed", full[0] if full else placement.device)
    unembed = found.get("unembed", full[-1] if full else embed)
    return Layout(embed, tuple(full), unembed, placement.offload)


def _filled(placement: Placement, sizes: list[int], embed_size: int, unembed_size: int
            ) -> Layout:
    """Fill devices in order within their budgets ("sequential"); "auto" without max_memory
    first caps each accelerator at an even share (accelerate's balanced map)."""
    budgets = dict(placement.max_memory) or free_memory()
    devices = list(budgets)
    accel = [d for d in devices if d.type != "cpu"]
    total = sum(sizes) + embed_size + unembed_size
    if placement.mode == "auto" and not placement.max_memory and len(accel) > 1:
        share = int(1.1 * total / len(accel)) + 1
        budgets = {d: min(b, share) if d.type != "cpu" else b for d, b in budgets.items()}
    offloaded = placement.offload is not None  # block weights rest off-device
    used = {d: 0 for d in devices}
    parts = [("the embedding", embed_size)] + [(f"block {i}", 0 if offloaded else s)
                                               for i, s in enumerate(sizes)]
    k, out = 0, []
    for what, size in parts + [("the unembedding", unembed_size)]:
        while k < len(devices) and used[devices[k]] + size > budgets[devices[k]]:
            k += 1
        if k == len(devices):
            raise InputError(f"device_map={placement.mode!r}: {what} does not fit in max_memory "
                             f"{_show(budgets)} (the model needs {total:,} bytes as loaded); "
                             f"raise max_memory or pass offload='cpu' / 'disk'")
        used[devices[k]] += size
        out.append(devices[k])
    return Layout(out[0], tuple(out[1:-1]), out[-1], placement.offload)


def free_memory() -> dict[torch.device, int]:
    """Free memory per accelerator (90%, as accelerate leaves headroom), then the CPU's."""
    out = {}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            out[torch.device(f"cuda:{i}")] = int(0.9 * torch.cuda.mem_get_info(i)[0])
    try:
        with open("/proc/meminfo") as f:  # MemAvailable, kB
            avail = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable"))
    except (OSError, StopIteration, ValueError):
        avail = 1 << 62  # unknown (not Linux): the CPU takes whatever is left
    out[torch.device("cpu")] = avail
    return out


def _show(budgets: Mapping[torch.device, int]) -> str:
    return "{" + ", ".join(f"{d}: {b:,}" for d, b in budgets.items()) + "}"
