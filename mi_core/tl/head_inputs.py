"""TransformerLens' per-head attention inputs in the forwards of
:class:`mi_core.tl.HookedTransformer` (``use_split_qkv_input`` / ``use_attn_in``).

With either switch on, TransformerLens' blocks repeat ``resid_pre`` per head (``hook_attn_in``
[batch, pos, n_heads, d_model]; ``hook_q_input`` with n_heads, ``hook_k_input`` /
``hook_v_input`` with n_key_value_heads) and normalise each head's copy: ``ln1.hook_scale``
is then [batch, pos, heads, 1] and ``ln1.hook_normalized`` [batch, pos, heads, d_model], once
for the queries' input, once for the keys' and once for the values' (the cache keeps the
last: the values', with n_key_value_heads heads on a grouped-query model), and a hook editing
one head's copy changes only that head's query, key or value. The cache's methods that divide
by ``blocks.{i}.ln1.hook_scale`` (``apply_ln_to_stack``, ``decompose_resid`` /
``accumulated_resid`` / ``stack_head_results`` with ``apply_ln``) then fail to broadcast, as
TransformerLens' do (a ``RuntimeError``).

The kernel's transformer backend takes that per-head path (and fires ln1's points on each
per-head input) when one of the per-head points is intervened on; :func:`force` asks for it
in every block the forward runs while a switch is on, with an identity intervention, so the
points have TransformerLens' shapes whether or not a hook is there.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from mi_core import HookSpec


def point_of(cfg: Any) -> Optional[str]:
    """The block point whose intervention selects the per-head path under `cfg`'s switches
    (None: both off). With ``use_split_qkv_input`` the queries' input (keys and values stay
    per key/value head); with ``use_attn_in`` alone ``hook_attn_in`` (all three per head)."""
    if getattr(cfg, "use_split_qkv_input", False):
        return "hook_q_input"
    if getattr(cfg, "use_attn_in", False):
        return "hook_attn_in"
    return None


def per_head(cfg: Any) -> bool:
    """Whether ln1 normalises per-head copies of the residual stream (either switch on)."""
    return point_of(cfg) is not None


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def force(spec: HookSpec, cfg: Any, blocks: range, names: set[str]) -> None:
    """Make every block of `blocks` that has the per-head points (`names`: the points this
    forward runs; latent-attention and shared-key layers have none) take the per-head path."""
    point = point_of(cfg)
    if point is None:
        return
    for i in blocks:
        name = f"blocks.{i}.{point}"
        if name in names:
            spec.intervene(name, _identity)


def unused_attn_in(name: str, cfg: Any, call: Callable[[torch.Tensor], torch.Tensor]
                   ) -> Callable[[torch.Tensor], torch.Tensor]:
    """`call` (the hooks of point `name`) as TransformerLens runs it: with both switches on,
    its blocks compute ``hook_attn_in`` but read q, k and v from ``hook_q_input`` / ... of
    ``resid_pre``, so the hooks at ``hook_attn_in`` run on a copy and change nothing."""
    if not (name.endswith(".hook_attn_in") and getattr(cfg, "use_attn_in", False)
            and getattr(cfg, "use_split_qkv_input", False)):
        return call

    def ignored(x: torch.Tensor) -> torch.Tensor:
        call(x.clone())
        return x
    return ignored


__all__ = ["force", "per_head", "point_of", "unused_attn_in"]
