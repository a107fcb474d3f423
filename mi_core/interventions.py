"""The intervention primitives and the one function that applies them.

Semantics shared by every backend (:func:`apply_intervention`):
- the operand is cast to the activation's dtype and device (one that overflows is refused);
- it must broadcast *to* the activation's shape (it may not enlarge it);
- the result always has the activation's shape and dtype;
- a callable ``(tensor, hook) -> tensor`` (or ``(tensor) -> tensor``) may return ``None``
  to mean "modified in place".

Everything that can be checked without the activation is checked once, when the
intervention is built or registered (finite operands, a Knockout mask of 0 / -inf only, a
callable's arity), so applying one costs no more than the arithmetic itself.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import attrs
import torch
from torch.utils.weak import WeakIdKeyDictionary

from mi_core.errors import InterventionError, MIError
from mi_core.points import HookPoint


class Intervention:
    """Base class of the built-in interventions."""

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        raise NotImplementedError

    def operand_shape(self) -> tuple[int, ...] | None:
        """Shape of the tensor operand, for validation before compute (None: no operand)."""
        return None


def _operand(hook: "HookPoint", kind: str, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    check_broadcast(hook, kind, tuple(t.shape), tuple(x.shape))
    return cast(hook, kind, t, x)


#: operand -> the (dtype, in-place version) it was found to fit: a forward checks each once
_FITS: Any = WeakIdKeyDictionary()


def cast(hook: "HookPoint | str", kind: str, t: torch.Tensor, x: torch.Tensor,
         remember: bool = True) -> torch.Tensor:
    """`t` in x's dtype and device; InterventionError when finite values become inf there
    (beyond the dtype's range). With `remember`, a (tensor, dtype, version) is checked once."""
    out = t.to(dtype=x.dtype)
    if out.dtype != t.dtype and out.is_floating_point():
        key = (out.dtype, 0 if t.is_inference() else t._version)
        if not remember or key not in _FITS.get(t, ()):
            lost = torch.isfinite(t) & ~torch.isfinite(out)
            if bool(lost.any()):
                raise InterventionError(
                    f"{kind} at {hook}: the operand reaches {float(t[lost].abs().max()):.4g} in "
                    f"magnitude, beyond {x.dtype} (largest finite {torch.finfo(x.dtype).max:.6g}): "
                    f"inf once cast; scale it down or load the model in a wider dtype")
            if remember:
                _FITS.setdefault(t, set()).add(key)
    return out.to(device=x.device)


def _fits(hook: "HookPoint", kind: str, value: float, x: torch.Tensor) -> None:
    """A number operand must be finite in the activation's dtype too."""
    if x.is_floating_point() and abs(value) > torch.finfo(x.dtype).max:
        cast(hook, kind, torch.tensor(value, dtype=torch.float64), x, remember=False)


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


# -- construction-time checks (run once, never per hook call) ----------------------------
def _finite_tensor(what: str, allow_neg_inf: bool = False) -> Callable[[Any], torch.Tensor]:
    """Converter: a tensor (or a Python number, as a 0-d tensor) with only finite values;
    with `allow_neg_inf`, -inf too (masked pre-softmax scores; the point is checked when
    the intervention is registered, see :func:`neg_inf_operand`)."""
    def convert(value: Any) -> torch.Tensor:
        if isinstance(value, bool) or not isinstance(value, (torch.Tensor, int, float)):
            raise InterventionError(f"{what} must be a tensor or a number, got "
                                    f"{type(value).__name__}")
        t = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        if t.dtype == torch.bool:
            raise InterventionError(f"{what} must be numeric, got a bool tensor")
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            if not (allow_neg_inf and t.is_floating_point()
                    and not bool((torch.isnan(t) | torch.isposinf(t)).any())):
                raise InterventionError(f"{what} holds {_non_finite(t)}: an intervention "
                                        f"operand must be finite")
        return t
    return convert


def _non_finite(t: torch.Tensor) -> str:
    n_nan, n_inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    return ", ".join(p for p in (f"{n_nan} NaN" if n_nan else "", f"{n_inf} inf" if n_inf else "")
                     if p) + f" value(s) (shape {list(t.shape)})"


def _finite_number(what: str) -> Callable[[Any], float]:
    def convert(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InterventionError(f"{what} must be a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise InterventionError(f"{what} is {value}: it must be finite")
        return float(value)
    return convert


def _scale_factor(value: Any) -> float | torch.Tensor:
    if isinstance(value, torch.Tensor):
        return _finite_tensor("Scale factor")(value)
    return _finite_number("Scale factor")(value)


def _knockout_mask(mask: Any) -> torch.Tensor:
    """A bool mask (True = remove) becomes 0 / -inf once; a float mask may hold only 0, -inf."""
    if not isinstance(mask, torch.Tensor):
        raise InterventionError(f"Knockout mask must be a tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(
            mask, float("-inf"))
    if not mask.is_floating_point():
        raise InterventionError(
            f"Knockout mask has dtype {mask.dtype}: give a bool mask (True = remove) or a "
            f"float mask of 0 (keep) and -inf (remove)")
    ok = (mask == 0) | (mask == float("-inf"))
    if not bool(ok.all()):
        bad = mask[~ok].unique()[:5].tolist()
        raise InterventionError(
            f"Knockout mask holds {bad}: a float mask may hold only 0 (keep) and -inf "
            f"(remove); use a bool mask (True = remove), or mi.Add for other additive offsets")
    return mask


def _steer_mask(mask: Any) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise InterventionError(f"Steer mask must be a tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
        raise InterventionError(f"Steer mask must be bool (or 0/1), got dtype {mask.dtype} with "
                                f"other values")
    return mask.to(torch.bool)


def _optional_number(what: str) -> Callable[[Any], float | None]:
    check = _finite_number(what)
    return lambda v: None if v is None else check(v)


def _as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InterventionError(f"Steer renormalize must be a bool, got {type(value).__name__}")
    return value


@attrs.define(eq=False)
class Replace(Intervention):
    """Replace the activation with `value` (broadcast to the activation's shape)."""

    value: torch.Tensor = attrs.field(converter=_finite_tensor("Replace value", True))

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        return _operand(hook, "Replace", self.value, x).expand(x.shape).clone()

    def operand_shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


@attrs.define(eq=False)
class Add(Intervention):
    """Add `value` (e.g. a scaled steering direction) to the activation."""

    value: torch.Tensor = attrs.field(converter=_finite_tensor("Add value", True))

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        return x + _operand(hook, "Add", self.value, x)

    def operand_shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


@attrs.define(eq=False)
class Knockout(Intervention):
    """Remove attention edges: a mask added to the *pre-softmax* scores
    (``attn.hook_attn_scores``; registering it anywhere else is an InterventionError).

    `mask` is bool (True = remove, converted once to 0 / -inf) or float holding only 0
    (keep) and -inf (remove). A row whose keys are all removed attends to nothing (zero
    output), never NaN.
    """

    mask: torch.Tensor = attrs.field(converter=_knockout_mask)

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        return x + _operand(hook, "Knockout", self.mask, x)

    def operand_shape(self) -> tuple[int, ...]:
        return tuple(self.mask.shape)


@attrs.define(eq=False)
class Scale(Intervention):
    """Multiply the activation by `factor` (a finite float or a broadcastable tensor)."""

    factor: float | torch.Tensor = attrs.field(converter=_scale_factor)

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        if isinstance(self.factor, torch.Tensor):
            return x * _operand(hook, "Scale", self.factor, x)
        _fits(hook, "Scale", self.factor, x)
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

    mask: torch.Tensor = attrs.field(converter=_steer_mask)
    scale: float = attrs.field(default=1.0, converter=_finite_number("Steer scale"))
    value: float | None = attrs.field(default=None, converter=_optional_number("Steer value"))
    renormalize: bool = attrs.field(default=True, converter=_as_bool)

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        m = _operand(hook, "Steer", self.mask, x).to(torch.bool)
        _fits(hook, "Steer", self.scale if self.value is None else self.value, x)
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


#: The built-in interventions: each returns a new tensor and never edits its input.
OUT_OF_PLACE = frozenset({Replace, Add, Knockout, Scale, Zero, Steer})


class CallableIntervention(Intervention):
    """A user callable, prepared once at registration: ``fn(tensor, hook)`` or ``fn(tensor)``
    (decided from its signature), returning a tensor of the activation's shape, or None
    (modified in place). An exception inside it becomes an InterventionError naming the
    hook point, with the user's exception chained (an MIError, already typed, passes as is)."""

    __slots__ = ("fn", "takes_hook")

    def __init__(self, fn: Callable[..., Any], point: "HookPoint | str") -> None:
        self.fn = fn
        self.takes_hook = _takes_hook(fn, point)

    def __call__(self, x: torch.Tensor, hook: "HookPoint") -> torch.Tensor:
        try:
            out = self.fn(x, hook) if self.takes_hook else self.fn(x)
        except MIError:  # already typed and naming its culprit (e.g. a dictionary's splice)
            raise
        except Exception as exc:
            raise InterventionError(f"callable intervention {_fn_name(self.fn)} at {hook} raised "
                                    f"{type(exc).__name__}: {exc}") from exc
        if out is None:  # modified in place, TransformerLens style
            return x
        if not isinstance(out, torch.Tensor):
            raise InterventionError(
                f"callable intervention {_fn_name(self.fn)} at {hook} returned "
                f"{type(out).__name__}, not a tensor of the activation's shape {list(x.shape)}")
        return out

    def __repr__(self) -> str:
        return f"CallableIntervention({_fn_name(self.fn)})"


def _label(iv: Intervention) -> str:
    return repr(iv) if isinstance(iv, CallableIntervention) else type(iv).__name__


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _takes_hook(fn: Callable[..., Any], point: "HookPoint | str") -> bool:
    """True for ``fn(tensor, hook)``, False for ``fn(tensor)``; decided once, from the signature.

    A second positional parameter that has a default is the hook only when it is named
    ``hook``; a callable whose signature cannot be read (some builtins) is called as
    ``fn(tensor)``.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    required_kw = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if not positional or len(required) > 2 or required_kw:
        raise InterventionError(
            f"callable intervention {_fn_name(fn)} at {point} has signature {sig}; it must take "
            f"(tensor) or (tensor, hook)")
    if len(positional) < 2:
        return False
    second = positional[1]  # (t, hook) / (t, hook=None); (t, scale=2.0) is a one-argument call
    return second.default is second.empty or second.name == "hook"


def neg_inf_operand(iv: Any) -> bool:
    """Whether `iv` carries -inf (allowed only where it means masking: pre-softmax scores)."""
    return isinstance(iv, (Replace, Add)) and iv.value.is_floating_point() and bool(
        torch.isneginf(iv.value).any())


def prepare(point: "HookPoint", iv: Any) -> Intervention:
    """The object :func:`apply_intervention` calls for `iv`, built once at registration."""
    if isinstance(iv, Intervention):
        return iv
    if callable(iv):
        return CallableIntervention(iv, point)
    raise InterventionError(
        f"intervention at {point} must be an Intervention or a callable (tensor, hook) -> "
        f"tensor, got {type(iv).__name__}")


def apply_intervention(hook: "HookPoint", iv: Intervention, x: torch.Tensor) -> torch.Tensor:
    """Apply one prepared intervention at `hook`; the single semantic path."""
    out = iv(x, hook)
    if out.shape != x.shape:
        raise InterventionError(
            f"{_label(iv)} at {hook} changed the shape from {list(x.shape)} to "
            f"{list(out.shape)}")
    if out.dtype != x.dtype or out.device != x.device:
        out = cast(hook, f"the result of {_label(iv)}", out, x, remember=False)
    return out
