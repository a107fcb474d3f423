"""What a layer attends with, whatever its mixer: the softmax pattern of an attention layer,
or the exact effective attention of a recurrent mixer (a point ``*.hook_effective_attn``
that a backend declares: A [batch, heads, seq, seq] with A @ x = y, signed and
unnormalised), so attention views and analyses read both."""

from __future__ import annotations

from typing import Any

import torch

from mi_core.plugin import HookPoint, HookSpec, MIModel
from mi_core.interp._common import as_ids, check_layers

#: The suffix every backend's effective-attention point ends with.
EFFECTIVE_SUFFIX = "hook_effective_attn"


def effective_attention_point(model: MIModel, layer: int) -> HookPoint | None:
    """Layer `layer`'s effective-attention point (e.g. ``blocks.3.ssm.hook_effective_attn``),
    or None when its mixer has none."""
    for p in model.hook_points():
        if p.layer == layer and p.suffix.endswith(EFFECTIVE_SUFFIX):
            return p
    return None


def layer_attention(model: MIModel, prompt: Any, layer: int
                    ) -> tuple[torch.Tensor, HookPoint]:
    """([batch, heads, seq, seq], the point read) for `prompt` (text or ids [batch, seq]).

    An attention layer gives its post-softmax pattern; a recurrent layer its exact effective
    attention. A layer with neither is a HookError naming the layer and its type.
    """
    (layer,) = check_layers([layer], model.num_layers)
    point = HookPoint.attn_pattern(layer)
    if not model.has_hook_point(point):
        point = effective_attention_point(model, layer) or point
    model.require_points([point], "an attention view")
    cache = model.forward(as_ids(model, prompt), HookSpec().capture(point))
    return cache.require(point), point


def display_weights(a: torch.Tensor) -> torch.Tensor:
    """A signed effective attention as weights to draw: |A| normalised per query row (rows of
    zeros stay zero). A softmax pattern comes back unchanged."""
    a = a.float()
    if bool((a >= 0).all()):
        return a
    mag = a.abs()
    return mag / mag.sum(-1, keepdim=True).clamp_min(1e-30)
