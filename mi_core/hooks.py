"""Hook specs and the hook cache: what to do at which point, and what came back.

A backend calls :meth:`HookRun.apply` at every hook point of its forward pass. That one
function is where intervention semantics live (registration order, dtype/device casting,
broadcasting, capture-after-intervention, copies for callables that edit in place), so every
backend behaves identically (docs/PLUGINS.md says what a backend must not do: edit in place).
"""

from __future__ import annotations

import difflib
import weakref
from typing import Any, Callable, Iterable, Iterator, Union

import torch

from mi_core.errors import HookError, InterventionError
from mi_core.interventions import (
    OUT_OF_PLACE, Intervention, Knockout, apply_intervention, neg_inf_operand, prepare,
)
from mi_core.points import (  # noqa: F401  (HookPoint and its helpers are re-exported here)
    KNOWN_GLOBAL_NAMES, KNOWN_LAYER_SUFFIXES, OPT_IN_SUFFIXES, PRE_SOFTMAX_SCORES, HookLike, HookPoint, LayerIndex,
    declare_layer_points, hook_name,
)
from mi_core.state import StateKnockoutSpec, StateSteeringSpec

InterventionLike = Union[Intervention, Callable[[torch.Tensor, HookPoint], Any],
                         Callable[[torch.Tensor], Any]]
BackwardHook = Callable[[torch.Tensor, HookPoint], Any]


class HookSpec:
    """What to capture and where to intervene during one forward pass.

    Reusable: it holds no tensors produced by a run. Methods chain:
    ``HookSpec().capture("blocks.0.hook_resid_post").intervene(hp, mi.Zero())``.
    """

    __slots__ = ("_captures", "_interventions", "_grads", "state_knockout", "state_steering")

    def __init__(self) -> None:
        self._captures: dict[str, HookPoint] = {}
        self._interventions: dict[str, list[tuple[HookPoint, InterventionLike, Intervention]]] = {}
        #: backward hooks per point, in registration order; fn None = capture the gradient
        self._grads: dict[str, list[tuple[HookPoint, BackwardHook | None]]] = {}
        self.state_knockout: StateKnockoutSpec | None = None
        self.state_steering: StateSteeringSpec | None = None

    # -- building ---------------------------------------------------------------------
    def capture(self, point: HookLike) -> "HookSpec":
        hp = HookPoint.parse(point)
        self._captures[hp.name] = hp
        return self

    def capture_all(self, points: Iterable[HookLike]) -> "HookSpec":
        for p in points:
            self.capture(p)
        return self

    def intervene(self, point: HookLike, intervention: InterventionLike) -> "HookSpec":
        """Apply `intervention` at `point` (after earlier ones there).

        Checked now, not per forward: a Knockout only at the pre-softmax scores
        (``attn.hook_attn_scores``), a callable's arity from its signature.
        """
        hp = HookPoint.parse(point)
        if isinstance(intervention, Knockout) and hp.suffix != PRE_SOFTMAX_SCORES:
            raise InterventionError(
                f"Knockout at {hp.name}: a Knockout is an additive pre-softmax mask and means "
                f"removal only at 'blocks.{{i}}.{PRE_SOFTMAX_SCORES}'; use mi.Steer at "
                f"attn.hook_pattern, or mi.Zero / mi.Replace elsewhere")
        if hp.suffix != PRE_SOFTMAX_SCORES and neg_inf_operand(intervention):
            raise InterventionError(
                f"{type(intervention).__name__} at {hp.name}: the operand holds -inf, which "
                f"means masking only at the pre-softmax scores (attn.hook_attn_scores)")
        prepared = prepare(hp, intervention)
        self._interventions.setdefault(hp.name, []).append((hp, intervention, prepared))
        return self

    def capture_grad(self, point: HookLike) -> "HookSpec":
        """Record the gradient at `point` when the output (or a metric of it) is
        back-propagated: ``cache.grad(point)`` after ``loss.backward()``. The forward then
        runs with autograd on (activations only; weights get no gradient)."""
        hp = HookPoint.parse(point)
        self._grads.setdefault(hp.name, []).append((hp, None))
        return self

    def add_backward_hook(self, point: HookLike, fn: BackwardHook) -> "HookSpec":
        """TransformerLens' backward hook: ``fn(grad, hook)`` is called with the gradient at
        `point` during backward; a tensor it returns replaces that gradient upstream."""
        hp = HookPoint.parse(point)
        if not callable(fn):
            raise HookError(f"backward hook at {hp.name} must be callable (grad, hook) -> "
                            f"tensor | None, got {type(fn).__name__}")
        self._grads.setdefault(hp.name, []).append((hp, fn))
        return self

    def set_state_knockout(self, spec: StateKnockoutSpec) -> "HookSpec":
        """Skip recurrent-state writes (backends with the state-interventions capability)."""
        if not isinstance(spec, StateKnockoutSpec):
            raise InterventionError(f"set_state_knockout needs a StateKnockoutSpec, got "
                                    f"{type(spec).__name__}")
        self.state_knockout = spec
        return self

    def set_state_steering(self, spec: StateSteeringSpec) -> "HookSpec":
        """Scale recurrent-state writes (backends with the state-interventions capability)."""
        if not isinstance(spec, StateSteeringSpec):
            raise InterventionError(f"set_state_steering needs a StateSteeringSpec, got "
                                    f"{type(spec).__name__}")
        self.state_steering = spec
        return self

    def extend(self, other: "HookSpec") -> "HookSpec":
        """Merge `other` into this spec; its interventions come after ours at shared points."""
        self._captures.update(other._captures)
        for name, items in other._interventions.items():
            self._interventions.setdefault(name, []).extend(items)
        for name, grads in other._grads.items():
            self._grads.setdefault(name, []).extend(grads)
        if other.state_knockout is not None:
            self.state_knockout = other.state_knockout
        if other.state_steering is not None:
            self.state_steering = other.state_steering
        return self

    def copy(self) -> "HookSpec":
        return HookSpec().extend(self)

    # -- queries ----------------------------------------------------------------------
    def is_empty(self) -> bool:
        return not (self._captures or self._interventions or self._grads
                    or self.state_knockout or self.state_steering)

    def needs_grad(self) -> bool:
        """Whether a gradient is captured or a backward hook registered (autograd needed)."""
        return bool(self._grads)

    def num_captures(self) -> int:
        return len(self._captures)

    def num_interventions(self) -> int:
        return sum(len(v) for v in self._interventions.values())

    def is_captured(self, point: HookLike) -> bool:
        return hook_name(point) in self._captures

    def has_intervention_at(self, point: HookLike) -> bool:
        return hook_name(point) in self._interventions

    def points(self) -> list[HookPoint]:
        """Every point this spec names (captures, then intervention-only points)."""
        seen = dict(self._captures)
        for name, items in self._interventions.items():
            seen.setdefault(name, items[0][0])
        for name, grads in self._grads.items():
            seen.setdefault(name, grads[0][0])
        return list(seen.values())

    def interventions_at(self, point: HookLike) -> list[InterventionLike]:
        """The interventions registered at `point`, as given (in registration order)."""
        return [iv for _, iv, _ in self._interventions.get(hook_name(point), [])]

    def validate(self, available: Iterable[HookPoint] | set[str], *,
                 num_layers: int | None = None) -> None:
        """Raise :class:`HookError` for any point the model does not provide.

        `available`: the model's points, or the set of their names (cached by MIModel).
        The message names the point, the valid layer range and the nearest valid names.
        """
        names = available if isinstance(available, set) else {
            HookPoint.parse(hp).name for hp in available}
        for hp in self.points():
            if hp.name in names:
                continue
            msg = f"hook point {hp.name!r} is not provided by this model"
            if hp.layer is not None and num_layers is not None and hp.layer >= num_layers:
                msg = (f"hook point {hp.name!r}: layer {hp.layer} out of range; "
                       f"valid layers are 0..{num_layers - 1}")
            close = difflib.get_close_matches(hp.name, sorted(names), n=3, cutoff=0.6)
            if close:
                msg += f"; nearest: {', '.join(close)}"
            raise HookError(msg)
        n = num_layers
        for spec in (self.state_knockout, self.state_steering):
            if spec is not None and n is not None:
                spec.validate(n)

    def start(self) -> "HookRun":
        """Begin one forward pass (a copying run if a callable or a gradient is asked for)."""
        edits = any(type(t[2]) not in OUT_OF_PLACE for v in self._interventions.values() for t in v)
        return GradHookRun(self) if self._grads else EditHookRun(self) if edits else HookRun(self)

    def __repr__(self) -> str:
        grads = f", grads={list(self._grads)}" if self._grads else ""
        return (f"HookSpec(captures={list(self._captures)}, "
                f"interventions={ {k: len(v) for k, v in self._interventions.items()} }{grads})")


class HookRun:
    """The per-forward state: applies interventions and stores captures.

    Backends write ``x = run.apply("blocks.3.hook_resid_post", x)``; when the spec does
    not touch that point this is one dict lookup and returns `x` unchanged.
    """

    __slots__ = ("spec", "captures", "_caps", "_ivs")

    def __init__(self, spec: HookSpec) -> None:
        self.spec = spec
        self.captures: dict[str, torch.Tensor] = {}
        self._caps = spec._captures
        self._ivs = spec._interventions

    def wants(self, name: str) -> bool:
        return name in self._caps or name in self._ivs

    def apply(self, name: str, x: torch.Tensor) -> torch.Tensor:
        items = self._ivs.get(name)
        if items is not None:
            for hp, _, iv in items:
                x = apply_intervention(hp, iv, x)
        if name in self._caps:
            self.captures[name] = x
        return x

    def finish(self, output: torch.Tensor, **extra: Any) -> "HookCache":
        return HookCache(output, self.captures, **extra)


class EditHookRun(HookRun):
    """A run with callables, which may edit in place: such an edit changes only its point. A
    callable gets a copy of a tensor whose storage is shared with a live tensor that was an
    earlier point's value (a capture; ``hook_mlp_in`` is ``hook_resid_mid``) or seen by one."""

    __slots__ = ("_seen",)

    def __init__(self, spec: HookSpec) -> None:
        super().__init__(spec)
        self._seen: dict[int, list[weakref.ref[torch.Tensor]]] = {}  # storage -> tensors seen

    def _edit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        for hp, _, iv in self._ivs.get(name, ()):  # (a freed tensor's address reused: no copy)
            if type(iv) in OUT_OF_PLACE:
                x = apply_intervention(hp, iv, x)
                continue  # a callable may keep what it saw or returned: both are noted
            live = any(r() is not None for r in self._seen.get(x.untyped_storage().data_ptr(), ()))
            x = self._note(apply_intervention(hp, iv, self._note(x.clone() if live else x)))
        return self._note(x)

    def _note(self, x: torch.Tensor) -> torch.Tensor:
        self._seen.setdefault(x.untyped_storage().data_ptr(), []).append(weakref.ref(x))
        return x

    def apply(self, name: str, x: torch.Tensor) -> torch.Tensor:
        x = self._edit(name, x)
        if name in self._caps:
            self.captures[name] = x
        return x


class GradHookRun(EditHookRun):
    """A HookRun for specs with gradient captures / backward hooks (a subclass, so a plain
    run pays nothing for them). At such a point the activation gets a tensor hook: a fresh
    view (so the gradient is the one flowing through this point's consumers only, as in
    TransformerLens where every hook point is its own module), or a leaf requiring grad when
    nothing upstream does."""

    __slots__ = ("grads", "_bwd")

    def __init__(self, spec: HookSpec) -> None:
        super().__init__(spec)
        self.grads: dict[str, torch.Tensor] = {}
        self._bwd = spec._grads

    def wants(self, name: str) -> bool:
        return name in self._caps or name in self._ivs or name in self._bwd

    def apply(self, name: str, x: torch.Tensor) -> torch.Tensor:
        x = self._edit(name, x)
        hooks = self._bwd.get(name)
        if hooks is not None:
            x = x.view_as(x) if x.requires_grad else x.detach().requires_grad_(True)
            grads = self.grads
            for hp, fn in hooks:
                x.register_hook(_grad_hook(hp, fn, grads))
        if name in self._caps:
            self.captures[name] = x
        return x

    def finish(self, output: torch.Tensor, **extra: Any) -> "HookCache":
        cache = HookCache(output, self.captures, **extra)
        cache._grads = self.grads
        return cache


def _grad_hook(hp: HookPoint, fn: "BackwardHook | None", grads: dict[str, torch.Tensor]
               ) -> Callable[[torch.Tensor], "torch.Tensor | None"]:
    if fn is None:
        def capture(g: torch.Tensor) -> None:
            grads[hp.name] = g
        return capture

    def call(g: torch.Tensor) -> torch.Tensor | None:
        out = fn(g, hp)
        if out is not None and (not isinstance(out, torch.Tensor) or out.shape != g.shape):
            raise HookError(f"backward hook at {hp.name} must return None or a tensor of shape "
                            f"{list(g.shape)}, got {getattr(out, 'shape', type(out).__name__)}")
        return out
    return call


class HookCache:
    """The result of a forward pass: logits (always) and the captured tensors."""

    def __init__(self, output: torch.Tensor, captures: dict[str, torch.Tensor] | None = None,
                 **extra: Any) -> None:
        self.output = output
        self._captures: dict[str, torch.Tensor] = dict(captures or {})
        self._grads: dict[str, torch.Tensor] | None = None  # filled by backward (capture_grad)
        #: backend-specific extras (e.g. ``past`` for generation, a final recurrent state)
        self.extra: dict[str, Any] = extra

    def __getitem__(self, point: HookLike) -> torch.Tensor:
        return self.require(point)

    def require(self, point: HookLike) -> torch.Tensor:
        name = hook_name(point)
        try:
            return self._captures[name]
        except KeyError:
            have = ", ".join(self._captures) or "nothing"
            raise HookError(f"hook point {name!r} was not captured (captured: {have})") from None

    def get(self, point: HookLike) -> torch.Tensor | None:
        return self._captures.get(hook_name(point))

    def __contains__(self, point: object) -> bool:
        if not isinstance(point, (str, HookPoint)):
            return False
        return hook_name(point) in self._captures

    def __len__(self) -> int:
        return len(self._captures)

    def __iter__(self) -> Iterator[str]:
        return iter(self._captures)

    def keys(self) -> list[str]:
        return list(self._captures)

    def items(self) -> list[tuple[str, torch.Tensor]]:
        return list(self._captures.items())

    def num_captures(self) -> int:
        return len(self._captures)

    def grad(self, point: HookLike) -> torch.Tensor:
        """The gradient at `point` (requested with ``HookSpec.capture_grad``) after a
        backward pass through ``output`` (or a metric of it)."""
        name = hook_name(point)
        if self._grads is None:
            raise HookError(f"no gradient for {name!r}: request it with "
                            f"HookSpec().capture_grad({name!r})")
        if name not in self._grads:
            raise HookError(f"no gradient for {name!r} yet: call .backward() on the output or a "
                            f"metric of it first (only points passed to capture_grad are kept)")
        return self._grads[name]

    def to(self, device: str | torch.device) -> "HookCache":
        """A cache with the output, captures and gradients on `device` (on a placed model each
        capture is on its own point's device); `extra` is kept as is."""
        move = lambda d: {k: v.to(device) for k, v in d.items()}  # noqa: E731
        out = HookCache(self.output.to(device), move(self._captures), **self.extra)
        out._grads = None if self._grads is None else move(self._grads)
        return out

    def __repr__(self) -> str:
        return f"HookCache(output={tuple(self.output.shape)}, captures={self.keys()})"
