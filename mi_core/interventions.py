"""The intervention primitives and the one function that applies them.

Semantics shared by every backend (:func:`apply_intervention`):
- the operand is cast to the activation's dtype and device;
- it must broadcast *to* the activation's shape (it may not enlarge it);
- the result always has the activation's shape and dtype;
- a callable ``(tensor, hook) -> tensor`` may return ``None`` to mean "modified in place".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

from mi_core.errors import InterventionError

if TYPE_CHECKING:
    from mi_core.hooks import HookPoint


class Intervention:
    """Base class of the built-in interventions."""

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        raise NotImplementedError

    def operand_shape(self) -> tuple[int, ...] | None:
        """Shape of the tensor operand, for validation before compute (None: no operand)."""
        return None


def _operand(hook: "HookPoint", kind: str, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    check_broadcast(hook, kind, tuple(t.shape), tuple(x.shape))
    return t.to(device=x.device, dtype=x.dtype)


def check_broadcast(hook: "HookPoint | str", kind: str, operand: tuple[int, ...],
                    target: tuple[int, ...]) -> None:
    """Raise InterventionError unless `operand` broadcasts to exactly `target`."""
    ok = len(operand) <= len(target) and all(
        o == 1 or o == t or t == -1
        for o, t in zip(reversed(operand), reversed(target))
    )
    if not ok:
        raise InterventionError(
            f"{kind} at {hook}: operand of shape {list(operand)} cannot broadcast to the "
            f"activation's shape {list(target)}"
        )


@attrs.define(eq=False)
class Replace(Intervention):
    """Replace the activation with `value` (broadcast to the activation's shape)."""

    value: torch.Tensor

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        return _operand(hook, "Replace", self.value, x).expand(x.shape).clone()

    def operand_shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


@attrs.define(eq=False)
class Add(Intervention):
    """Add `value` (e.g. a scaled steering direction) to the activation."""

    value: torch.Tensor

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        return x + _operand(hook, "Add", self.value, x)

    def operand_shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


@attrs.define(eq=False)
class Knockout(Intervention):
    """Add a pre-softmax mask to attention scores: 0 keeps an edge, -inf removes it.

    A row whose keys are all removed attends to nothing (zero output), never NaN.
    """

    mask: torch.Tensor

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        return x + _operand(hook, "Knockout", self.mask, x)

    def operand_shape(self) -> tuple[int, ...]:
        return tuple(self.mask.shape)


@attrs.define(eq=False)
class Scale(Intervention):
    """Multiply the activation by `factor` (a float or a broadcastable tensor)."""

    factor: float | torch.Tensor

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        if isinstance(self.factor, torch.Tensor):
            return x * _operand(hook, "Scale", self.factor, x)
        return x * self.factor

    def operand_shape(self) -> tuple[int, ...] | None:
        return tuple(self.factor.shape) if isinstance(self.factor, torch.Tensor) else None


@attrs.define(eq=False)
class Zero(Intervention):
    """Set the activation to zero."""

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        return torch.zeros_like(x)


@attrs.define(eq=False)
class Steer(Intervention):
    """Post-softmax attention steering at ``hook_pattern``, rows renormalised to sum 1.

    `mask` (bool, broadcastable to [batch, heads, seq_q, seq_k]) selects the edges; they
    are multiplied by `scale`, or set to `value` when `value` is given. Rows are then
    renormalised over the keys unless ``renormalize=False``.
    """

    mask: torch.Tensor
    scale: float = 1.0
    value: float | None = None
    renormalize: bool = True

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        m = _operand(hook, "Steer", self.mask, x).to(torch.bool)
        if self.value is not None:
            out = torch.where(m, torch.as_tensor(self.value, dtype=x.dtype, device=x.device), x)
        else:
            out = torch.where(m, x * self.scale, x)
        if self.renormalize:
            denom = out.sum(dim=-1, keepdim=True)
            out = torch.where(denom > 0, out / denom.clamp_min(torch.finfo(x.dtype).tiny), out)
        return out

    def operand_shape(self) -> tuple[int, ...]:
        return tuple(self.mask.shape)


def apply_intervention(hook: "HookPoint", iv: Any, x: torch.Tensor) -> torch.Tensor:
    """Apply one intervention (built-in or callable) at `hook`; the single semantic path."""
    if isinstance(iv, Intervention):
        out = iv(x, hook)
    else:
        try:
            out = iv(x, hook)
        except TypeError as exc:  # a one-argument callable
            if "positional argument" not in str(exc):
                raise
            out = iv(x)
        if out is None:  # modified in place, TransformerLens style
            return x
        if not isinstance(out, torch.Tensor):
            raise InterventionError(
                f"callable intervention at {hook} returned {type(out).__name__}, not a tensor"
            )
    if out.shape != x.shape:
        raise InterventionError(
            f"intervention at {hook} changed the shape from {list(x.shape)} to {list(out.shape)}"
        )
    if out.dtype != x.dtype or out.device != x.device:
        out = out.to(device=x.device, dtype=x.dtype)
    return out
