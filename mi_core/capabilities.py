"""What a backend can do beyond the MIBackend protocol, as small runtime-checkable protocols.

A backend declares a capability by implementing its members; ``MIModel`` and the analyses
check with :func:`require` before any compute and raise :class:`CapabilityError` naming the
capability, what needed it and the backend. No analysis probes a backend with ``getattr``.

| capability | members | used by |
|---|---|---|
| :class:`HookShapes` | ``hook_shape(point, batch, seq)`` | operand checks before compute |
| :class:`KVCachedGeneration` | ``new_past(batch)``, ``forward(..., past=)`` | ``MIModel.generate`` |
| :class:`LayerSchedule` | ``check_layer_schedule(schedule)``, ``forward(..., layer_schedule=, between_layers=)`` | recurrent passes |
| :class:`StateInterventions` | ``check_state_spec(spec, seq)``, applies ``HookSpec.state_*`` | state knockout / steering |
| :class:`WeightAccess` | ``get_weight(name, layer)`` | decomposition, circuits |
| :class:`Readout` | ``final_norm(x, scale)``, ``unembed(x)`` | direct logit attribution |
| :class:`Gradients` | ``differentiable = True`` | attribution patching, gradient captures |
| :class:`WeightProcessing` | ``process_weights(fold_ln=, ...)`` | ``MIModel.process_weights`` |
| :class:`LayerTypes` | ``layer_types`` (one mixer name per layer) | ``MIModel.layer_types`` |
| :class:`ContextLength` | ``context_length``, ``cache_bytes(batch, tokens)`` | length checks |
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import torch

from mi_core.errors import CapabilityError
from mi_core.points import HookPoint
from mi_core.state import StateKnockoutSpec, StateSteeringSpec


@runtime_checkable
class HookShapes(Protocol):
    """The shape of every hook point's activation, for checking operands before compute."""

    def hook_shape(self, point: "HookPoint", batch: int, seq: int) -> tuple[int, ...] | None:
        """Shape at `point` for ids [batch, seq]; -1 in a dimension means "any length"."""


@runtime_checkable
class KVCachedGeneration(Protocol):
    """``forward(ids, hooks, past=new_past(batch))`` consumes `ids` after what `past` holds
    and extends `past` in place (a KV cache, or a recurrent state)."""

    def new_past(self, batch_size: int) -> Any:
        """An empty cache for `batch_size` sequences."""


@runtime_checkable
class LayerSchedule(Protocol):
    """``forward(..., layer_schedule=[layer, ...], between_layers=fn)`` runs the layers in
    that order (repeats allowed) and calls ``fn(step, layer, resid) -> resid`` after each."""

    def check_layer_schedule(self, schedule: Sequence[int]) -> None:
        """Raise an MIError if this backend cannot run `schedule`."""


@runtime_checkable
class StateInterventions(Protocol):
    """The backend carries a recurrent state and applies ``HookSpec.state_knockout`` /
    ``state_steering`` to its key-value writes."""

    def check_state_spec(self, spec: "StateKnockoutSpec | StateSteeringSpec",
                         seq: int | None) -> None:
        """Raise InterventionError if `spec` cannot apply to a call of `seq` tokens
        (None: positions are absolute, across calls that share a state)."""


@runtime_checkable
class WeightAccess(Protocol):
    """Weights in TransformerLens names (``W_Q`` [heads, d_model, d_head], ``W_E``, ...)."""

    def get_weight(self, name: str, layer: int | None = None) -> torch.Tensor:
        """The weight `name` (of `layer`, or global when None); an MIError if absent."""


@runtime_checkable
class Readout(Protocol):
    """The final norm and the unembedding as separate functions (linear attribution)."""

    def final_norm(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., d_model] -> normalised [..., d_model]; `scale` [..., 1] replaces the divisor."""

    def unembed(self, normalized: torch.Tensor) -> torch.Tensor:
        """[..., d_model] after the final norm -> logits [..., vocab]."""


@runtime_checkable
class Gradients(Protocol):
    """The forward is differentiable: gradients flow through every hook point."""

    differentiable: bool


@runtime_checkable
class LayerTypes(Protocol):
    """Which mixer each layer has: ``layer_types[i]`` is e.g. "full_attention",
    "sliding_attention" or a recurrent mixer's name (one string per layer)."""

    layer_types: Sequence[str]


@runtime_checkable
class WeightProcessing(Protocol):
    """TransformerLens' weight processing in place (fold norms, centre writing weights and
    the unembedding, fold value biases); logits unchanged."""

    def process_weights(self, *, fold_ln: bool, center_writing_weights: bool,
                        center_unembed: bool, fold_value_biases: bool) -> None:
        """Rewrite the weights in place; an MIError for a step this model cannot take."""


@runtime_checkable
class ContextLength(Protocol):
    """The trained context (positions; None: unknown); cache bytes after `tokens` of `batch`."""

    context_length: int | None

    def cache_bytes(self, batch: int, tokens: int) -> int: ...


@runtime_checkable
class ResidualTerms(Protocol):
    """How the layers write the residual stream. ``residual_not_a_sum`` is "" when the last
    layer's ``hook_resid_post`` is layer 0's ``hook_resid_pre`` plus every layer's attention
    (or mixer) and MLP output, the premise of residual decomposition and direct logit
    attribution; otherwise it says why not (a scalar multiplies each layer's output, a branch
    adds to it beside attention and the MLP, several residual streams mix), and those
    analyses refuse (:func:`require_residual_sum`). A backend that does not declare it is
    taken to write a sum."""

    residual_not_a_sum: str


def require_residual_sum(backend: Any, needed_for: str) -> None:
    """CapabilityError when `backend` declares its final residual is not a sum of the layers'
    outputs (:class:`ResidualTerms`), naming what needed it and why."""
    why = backend.residual_not_a_sum if isinstance(backend, ResidualTerms) else ""
    if why:
        raise CapabilityError(f"{needed_for} needs the final residual to be the embedding plus "
                              f"each layer's attention and MLP outputs, which it is not in "
                              f"this {backend.name} model: {why}")


@runtime_checkable
class HeadTerms(Protocol):
    """``heads_not_a_sum``: "" when each layer's per-head results (``z[h] @ W_O[h]``, plus
    ``b_O``) sum to its ``hook_attn_out``, else why not (a norm on the attention output);
    per-head attribution refuses then (:func:`require_head_sum`). Undeclared: they sum."""

    heads_not_a_sum: str


def require_head_sum(backend: Any, needed_for: str) -> None:
    """CapabilityError naming `needed_for` and why, when `backend` declares (:class:`HeadTerms`)
    that its heads' results do not sum to the attention output."""
    if why := (backend.heads_not_a_sum if isinstance(backend, HeadTerms) else ""):
        raise CapabilityError(f"{needed_for} needs each head's result z @ W_O to be a term of "
                              f"hook_attn_out, which it is not in this {backend.name} model: "
                              f"{why}")


ALL: dict[str, type] = {
    "hook shapes": HookShapes, "KV-cached generation": KVCachedGeneration,
    "layer schedule": LayerSchedule, "state interventions": StateInterventions,
    "weight access": WeightAccess, "readout": Readout, "gradients": Gradients,
    "weight processing": WeightProcessing, "layer types": LayerTypes,
    "context length": ContextLength,
}


def has(backend: Any, capability: type) -> bool:
    """Whether `backend` declares `capability` (for Gradients: and sets it true)."""
    if not isinstance(backend, capability):
        return False
    return capability is not Gradients or bool(backend.differentiable)


def require(backend: Any, capability: type, needed_for: str) -> None:
    """CapabilityError naming the capability, what needs it and the backend, unless declared."""
    if not has(backend, capability):
        label = next((k for k, v in ALL.items() if v is capability), capability.__name__)
        raise CapabilityError(f"{needed_for} needs the {label!r} capability "
                              f"({capability.__name__}), which the {backend.name} backend does "
                              f"not declare")


def capabilities(backend: Any) -> list[str]:
    """The labels of every capability `backend` declares."""
    return [label for label, cap in ALL.items() if has(backend, cap)]
