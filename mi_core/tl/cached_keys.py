"""``attn.hook_rot_k`` in a KV-cached forward, as TransformerLens has it.

TransformerLens caches the keys before the rotation (after ``hook_k``) and rotates every
cached key again at each forward, so in a forward after ``past_kv_cache`` (and each step of
``generate(use_past_kv_cache=True)``) ``hook_rot_k`` is [batch, cached + new, kv_heads,
d_head] (``hook_q`` / ``hook_k`` / ``hook_v`` / ``hook_rot_q`` cover the new positions only),
and an edit there changes the keys this forward attends to, cached positions included, but
never the cache (the next forward rotates the cached keys afresh).

The kernel caches the keys after the rotation. :class:`FullKeys` gives a forward the same
semantics where ``hook_rot_k`` is hooked or cached: its hooks run on the cached rotated keys
then the new ones (one kernel intervention, which keeps the point's shape); the edited cached
part is put in the backend's cache for this forward only and the new part goes on to the
kernel, which appends it and attends to it; when the forward ends the cache gets back the
cached keys and the new keys as they were before the user's hooks. The rotated keys of a
position do not depend on the forward that rotates them, so the full value equals
TransformerLens'.
Backends whose cache has no per-layer key tensors (``keys``) keep the new positions only.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from mi_core import HookError


class FullKeys:
    """The per-layer bookkeeping of one cached forward (see the module doc)."""

    def __init__(self, past: Any, blocks: range, active: set[str]) -> None:
        keys = getattr(past, "keys", None)
        self.past = past if isinstance(keys, dict) else None
        #: the ``hook_rot_k`` points this forward runs on every position
        self.names = {f"blocks.{i}.attn.hook_rot_k" for i in blocks} & active \
            if self.past is not None else set()
        #: layer (the cache's step) -> (its cached keys [b, g, cached, d_head] or None,
        #: the new rotated keys before the user's hooks [b, new, g, d_head])
        self.saved: dict[int, tuple[Optional[torch.Tensor], torch.Tensor]] = {}
        #: point -> its full value after the user's hooks (run_with_cache's entry)
        self.full: dict[str, torch.Tensor] = {}

    def around(self, name: str, call: Optional[Callable[[torch.Tensor], torch.Tensor]]
               ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The kernel intervention at `name` (a layer's ``hook_rot_k``) running `call` (the
        point's hooks, or None) on the full keys: new rotated keys [b, new, g, d_head] ->
        the new part of what `call` returned (a kernel intervention keeps its shape)."""
        layer = int(name.split(".")[1])

        def full_keys(new: torch.Tensor) -> torch.Tensor:
            cached = self.past.keys.get(layer)  # type: ignore[union-attr]  [b, g, n, d_head]
            self.saved[layer] = (cached, new.detach().clone())
            n = 0 if cached is None else cached.shape[2]
            full = new if cached is None else torch.cat(
                [cached.transpose(1, 2).to(new.dtype), new], dim=1)
            want = [new.shape[0], n + new.shape[1], *new.shape[2:]]
            full = full if call is None else call(full)
            if list(full.shape) != want:
                raise HookError(f"{name}: a hook returned shape {list(full.shape)}, expected "
                                f"{want} (the cached and the new positions)")
            self.full[name] = full
            if n:  # this forward attends to the edited cached keys (undone by restore)
                self.past.keys[layer] = full[:, :n].transpose(1, 2)  # type: ignore[union-attr]
            return full[:, n:]
        return full_keys

    def restore(self) -> None:
        """The cache as TransformerLens keeps it: the user's edits at ``hook_rot_k`` undone
        (the keys before them, cached then new)."""
        keys = self.past.keys if self.past is not None else {}
        for layer, (cached, new) in self.saved.items():
            n = 0 if cached is None else cached.shape[2]
            now = keys.get(layer)
            if now is not None and now.shape[2] == n + new.shape[1]:  # appended
                new = new.transpose(1, 2).to(now.dtype)
                keys[layer] = new if cached is None else torch.cat([cached, new], dim=2)
            elif cached is not None:  # the forward stopped before this layer appended
                keys[layer] = cached
        self.saved.clear()

    def update(self, values: dict[str, torch.Tensor]) -> None:
        """run_with_cache's entries of ``hook_rot_k``: the full keys."""
        for name, full in self.full.items():
            if name in values:
                values[name] = full


__all__ = ["FullKeys"]
