"""Running the hooks of :class:`mi_core.tl.HookedTransformer`'s hook points inside the
kernel's forward: a point's forward hooks as a kernel intervention (``ln1``'s repeated as
TransformerLens' three ln1 calls), its backward hooks as torch's full backward hooks, and a
user's exception carried through the kernel unchanged."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from mi_core import MIError
from mi_core.tl import head_inputs
from mi_core.tl.hook_points import HookPoint


class _UserHookError(MIError):
    """Carries an exception a user's hook raised through the kernel, to be re-raised as is."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


def _call_point(point: HookPoint, x: torch.Tensor) -> torch.Tensor:
    """The point's forward hooks on `x` (through the module, so any torch forward hook runs);
    an exception of the user's is carried through the kernel unchanged."""
    try:
        out = point(x)
    except MIError:
        raise
    except Exception as exc:
        raise _UserHookError(exc) from exc
    return out


def _caller(name: str, point: HookPoint, state: dict[Any, Any],
            model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The kernel intervention running `point`'s hooks. ``hook_mlp_in`` gets a copy (as in
    TransformerLens, an in-place edit there leaves ``hook_resid_mid`` as it was); ``ln1``'s
    two points run their hooks three times, interleaved as TransformerLens' three ln1 calls
    (with per-head inputs the kernel itself runs ln1 three times: mi_core.tl.head_inputs)."""
    if name.endswith("hook_mlp_in"):
        return lambda x: _call_point(point, x.clone())
    if not (name.startswith("blocks.") and ".ln1.hook_" in name) or \
            head_inputs.per_head(model.cfg):
        return lambda x: _call_point(point, x)
    block = name.split(".")[1]
    scale = model.hook_dict.get(f"blocks.{block}.ln1.hook_scale")
    norm = model.hook_dict.get(f"blocks.{block}.ln1.hook_normalized")
    is_scale = name.endswith("hook_scale")

    def ln1(x: torch.Tensor) -> torch.Tensor:
        copy = x.clone()
        out = _call_point(point, x)
        if is_scale:
            state[block] = copy
            if norm is None or not norm.fwd_hooks:  # hook_normalized will not repeat them
                for _ in range(2):
                    _call_point(point, copy.clone())
            return out
        saved = state.pop(block, None)
        for _ in range(2):
            if saved is not None and scale is not None:
                _call_point(scale, saved.clone())
            _call_point(point, copy.clone())
        return out
    return ln1


def _bwd_caller(point: HookPoint) -> Callable[[torch.Tensor, Any], Optional[torch.Tensor]]:
    """The kernel backward hook running `point`'s backward hooks as torch's full backward
    hooks do: each gets the incoming gradient; the last tensor returned replaces it. The
    hooks are those of this forward, as torch's: run_with_hooks' fire after it returns."""
    handles = list(point.bwd_hooks)

    def call(grad: torch.Tensor, hook: Any) -> Optional[torch.Tensor]:
        result = None
        for handle in handles:
            out = handle.user_hook(grad, hook=point)  # type: ignore[misc]
            if isinstance(out, tuple):
                out = out[0]
            if out is not None:
                result = out
        return result
    return call


def _grad_hooks(x: torch.Tensor, point: HookPoint, grads: Optional[dict[str, torch.Tensor]],
                name: str) -> None:
    """`point`'s backward hooks (and run_with_cache's gradient store) on the tensor `x`."""
    if not x.requires_grad:
        return
    if point.bwd_hooks:
        call = _bwd_caller(point)
        x.register_hook(lambda grad: call(grad, point))
    if grads is not None:
        def store(grad: torch.Tensor) -> None:
            grads[name] = grad
        x.register_hook(store)
