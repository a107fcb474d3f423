"""Recurrent feedback ("anacrousis"): run a block of layers more than once, optionally
injecting feedback vectors into the residual stream between passes.

The backend runs a ``layer_schedule`` (layer indices, repeats allowed) and calls
``between_layers(step_index, layer, resid) -> resid`` after each step; this module builds
both from a :class:`RecurrentPassSpec`. Hooks at a re-run layer fire once per pass (a
capture keeps the last pass).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs
import torch

from mi_core.plugin import (
    GenerationResult, HookCache, HookSpec, InterventionError, LayerSchedule, MIModel,
)
from mi_core.interp._common import as_ids, check_layers, norm_position


@attrs.define
class RecurrentFeedbackEntry:
    """Add ``scale * vector`` [d_model] at token `position` (negative: from the end) of the
    residual stream after each pass of the block that is followed by another pass."""

    vector: torch.Tensor
    scale: float = 1.0
    position: int = -1


@attrs.define
class RecurrentPassSpec:
    """Layers ``loop_start..loop_end`` (inclusive) run ``1 + extra_passes`` times.

    ``sustained``: in :func:`generate_recurrent`, use the recurrent schedule for every
    forward call (True) or only for the first generated token (False).
    """

    loop_start: int
    loop_end: int
    extra_passes: int = 1
    feedback: list[RecurrentFeedbackEntry] = attrs.field(factory=list)
    sustained: bool = True

    def validate(self, model: MIModel) -> None:
        check_layers([self.loop_start, self.loop_end], model.num_layers)
        if self.loop_start > self.loop_end:
            raise InterventionError(f"recurrent block start {self.loop_start} is after its end "
                                    f"{self.loop_end}")
        if self.extra_passes < 0:
            raise InterventionError(f"extra_passes must be >= 0, got {self.extra_passes}")
        for fb in self.feedback:
            if not isinstance(fb.vector, torch.Tensor) or not fb.vector.is_floating_point():
                raise InterventionError(f"feedback vector must be a float tensor, got "
                                        f"{type(fb.vector).__name__}")
            if not bool(torch.isfinite(fb.vector).all()):
                raise InterventionError("feedback vector holds NaN or inf values")
            if isinstance(fb.scale, bool) or not isinstance(fb.scale, (int, float)) \
                    or not math.isfinite(fb.scale):
                raise InterventionError(f"feedback scale must be a finite number, got {fb.scale!r}")
            if isinstance(fb.position, bool) or not isinstance(fb.position, int):
                raise InterventionError(f"feedback position must be an int, got {fb.position!r}")
            if fb.vector.reshape(-1).shape[0] != model.hidden_size:
                raise InterventionError(f"feedback vector has {fb.vector.numel()} elements, the "
                                        f"model's d_model is {model.hidden_size}")

    def schedule(self, num_layers: int) -> list[int]:
        """The layer order: 0..end, then start..end again `extra_passes` times, then the rest."""
        block = list(range(self.loop_start, self.loop_end + 1))
        return (list(range(self.loop_end + 1)) + block * self.extra_passes
                + list(range(self.loop_end + 1, num_layers)))

    def feedback_steps(self) -> set[int]:
        """Step indices (into the schedule) after which feedback is injected."""
        n = self.loop_end - self.loop_start + 1
        first_end = self.loop_end
        return {first_end + k * n for k in range(self.extra_passes)}


def _between(spec: RecurrentPassSpec, offset: int = 0
             ) -> Callable[[int, int, torch.Tensor], torch.Tensor] | None:
    """The ``between_layers`` hook for one forward call over tokens ``offset..offset+seq``.

    A feedback position p >= 0 is the absolute token p (applied in the call that processes
    it); p < 0 counts from the end of the call's tokens (with a KV cache each generation
    step processes one token, so -1 feeds back into every generated token as it is made).
    """
    if not spec.feedback:
        return None
    steps = spec.feedback_steps()

    def between(step: int, layer: int, resid: torch.Tensor) -> torch.Tensor:
        if step not in steps:
            return resid
        seq = resid.shape[1]
        resid = resid.clone()
        for fb in spec.feedback:
            i = seq + fb.position if fb.position < 0 else fb.position - offset
            if 0 <= i < seq:
                v = fb.vector.reshape(-1).to(device=resid.device, dtype=resid.dtype)
                resid[:, i] += fb.scale * v
        return resid
    return between


def _options(model: MIModel, spec: RecurrentPassSpec, offset: int = 0) -> dict[str, Any]:
    return {"layer_schedule": spec.schedule(model.num_layers),
            "between_layers": _between(spec, offset)}


def forward_recurrent(model: MIModel, prompt: Any, spec: RecurrentPassSpec,
                      hooks: HookSpec | None = None, **kwargs: Any) -> HookCache:
    """One forward pass with the block re-run (and feedback injected) per `spec`.
    Needs the layer-schedule capability (CapabilityError before compute otherwise)."""
    model.require(LayerSchedule, "a recurrent pass")
    spec.validate(model)
    ids = as_ids(model, prompt)
    for fb in spec.feedback:
        norm_position(fb.position, ids.shape[1], "feedback position")
    return model.forward(ids, hooks, **_options(model, spec), **kwargs)


def generate_recurrent(model: MIModel, prompt: Any, spec: RecurrentPassSpec,
                       max_new_tokens: int = 20, temperature: float = 0.0,
                       hooks: HookSpec | None = None, stop_at_eos: bool = True,
                       generator: torch.Generator | None = None) -> GenerationResult:
    """:meth:`MIModel.generate` with the recurrent schedule as per-step forward options:
    the same loop (KV cache, EOS, sampling, padding) as plain generation.

    ``spec.sustained``: every forward call runs the recurrent schedule; otherwise only the
    first token is computed with it (one uncached pass over the prompt) and the rest is
    plain generation from the prompt and that token.
    """
    model.require(LayerSchedule, "generate_recurrent")
    spec.validate(model)
    ids = as_ids(model, prompt)
    if spec.sustained:
        return model.generate(ids, max_new_tokens, temperature, hooks=hooks,
                              stop_at_eos=stop_at_eos, generator=generator,
                              forward_options=lambda offset: _options(model, spec, offset))
    return model.generate(ids, max_new_tokens, temperature, hooks=hooks, stop_at_eos=stop_at_eos,
                          generator=generator, prefill_options=_options(model, spec))
