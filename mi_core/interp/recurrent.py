"""Recurrent feedback ("anacrousis"): run a block of layers more than once, optionally
injecting feedback vectors into the residual stream between passes.

The backend runs a ``layer_schedule`` (layer indices, repeats allowed) and calls
``between_layers(step_index, layer, resid) -> resid`` after each step; this module builds
both from a :class:`RecurrentPassSpec`. Hooks at a re-run layer fire once per pass (a
capture keeps the last pass).
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import torch

from mi_core.backend import GenerationResult, MIModel, sample_token
from mi_core.errors import InterventionError
from mi_core.hooks import HookCache, HookSpec
from mi_core.interp._common import as_ids, check_layers


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

    ``sustained``: in :func:`generate_recurrent`, use the recurrent schedule at every
    generation step (True) or only for the first step, the prefill (False).
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


def _between(spec: RecurrentPassSpec) -> Callable[[int, int, torch.Tensor], torch.Tensor] | None:
    if not spec.feedback:
        return None
    steps = spec.feedback_steps()

    def between(step: int, layer: int, resid: torch.Tensor) -> torch.Tensor:
        if step not in steps:
            return resid
        resid = resid.clone()
        for fb in spec.feedback:
            v = fb.vector.reshape(-1).to(device=resid.device, dtype=resid.dtype)
            resid[:, fb.position] += fb.scale * v
        return resid
    return between


def forward_recurrent(model: MIModel, prompt: Any, spec: RecurrentPassSpec,
                      hooks: HookSpec | None = None, **kwargs: Any) -> HookCache:
    """One forward pass with the block re-run (and feedback injected) per `spec`."""
    spec.validate(model)
    ids = as_ids(model, prompt)
    return model.forward(ids, hooks, layer_schedule=spec.schedule(model.num_layers),
                         between_layers=_between(spec), **kwargs)


def generate_recurrent(model: MIModel, prompt: Any, spec: RecurrentPassSpec,
                       max_new_tokens: int = 20, temperature: float = 0.0,
                       hooks: HookSpec | None = None, stop_at_eos: bool = True,
                       generator: torch.Generator | None = None) -> GenerationResult:
    """Generate with the recurrent schedule (every step when ``spec.sustained``, else the
    first step only). Without a KV cache: each step recomputes the whole prefix, so with
    ``sustained=False`` later steps see the prompt through the plain forward."""
    spec.validate(model)
    ids = as_ids(model, prompt)
    eos = getattr(getattr(model.backend, "tokenizer", None), "eos_token_id", None) \
        if stop_at_eos else None
    new: list[torch.Tensor] = []
    cur = ids
    for step in range(max_new_tokens):
        if step == 0 or spec.sustained:
            logits = forward_recurrent(model, cur, spec, hooks).output
        else:
            logits = model.forward(cur, hooks).output
        nxt = sample_token(logits[:, -1].float(), temperature, generator)
        new.append(nxt)
        cur = torch.cat([cur, nxt[:, None]], 1)
        if eos is not None and bool((nxt == eos).all()):
            break
    new_t = torch.stack(new, 1) if new else ids.new_zeros((ids.shape[0], 0))
    tok = getattr(model.backend, "tokenizer", None)
    text = [tok.decode(r.tolist()) for r in new_t] if tok is not None else []
    return GenerationResult(tokens=cur, new_tokens=new_t, text=text)
