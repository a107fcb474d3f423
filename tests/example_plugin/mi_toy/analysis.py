"""A third-party analysis: the norm of the residual stream after every layer.

It speaks only to the kernel's public API (a HookSpec, the model's hook points), so it works
on any backend that has ``blocks.{i}.hook_resid_post``; the plugin registers it as a model
convenience, ``model.resid_norms(prompt)``, and as the command ``mi resid-norms``.
"""

from __future__ import annotations

from typing import Any

from mi_core.plugin import HookPoint, HookSpec


def resid_norms(model: Any, prompt: str, position: int = -1) -> list[float]:
    """L2 norm of ``blocks.{i}.hook_resid_post`` at `position` for every layer i."""
    points = [HookPoint.resid_post(i) for i in range(model.num_layers)]
    model.require_points(points, "resid_norms")
    cache = model.forward(model.to_tokens(prompt), HookSpec().capture_all(points))
    return [float(cache[p][0, position].float().norm()) for p in points]
