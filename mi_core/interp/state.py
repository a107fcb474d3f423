"""Results of recurrent-state interventions (knockout / steering of the key-value write) and
runners: backend-agnostic, for any backend with the state-interventions capability
(:class:`mi_core.capabilities.StateInterventions`); others refuse before compute."""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import torch

from mi_core.plugin import HookSpec, StateInterventions, StateKnockoutSpec, StateSteeringSpec
from mi_core.interp.effects import TokenEffect, kl_rows, token_effects


@attrs.define
class _StateResult:
    #: [batch, seq, vocab] logits without / with the state intervention (F32, CPU).
    baseline_logits: torch.Tensor
    intervened_logits: torch.Tensor
    positions: list[int]
    #: None: every layer.
    layers: list[int] | None

    def kl_divergence(self, position: int = -1) -> float:
        """KL(baseline || intervened) of the next-token distribution at `position`,
        averaged over the batch (nats)."""
        return float(kl_rows(self.baseline_logits[:, position], self.intervened_logits[:, position],
                             torch.float64).mean())

    def kl_per_position(self) -> torch.Tensor:
        """[seq] KL(baseline || intervened) per position, averaged over the batch."""
        return kl_rows(self.baseline_logits, self.intervened_logits, torch.float64).mean(0).float()

    def max_abs_logit_diff(self) -> float:
        return float((self.baseline_logits - self.intervened_logits).abs().max())

    # The one metric convention of every effect: intervened − baseline.
    def token_effects(self, tokens: Sequence[int], position: int = -1, row: int = 0
                      ) -> list[TokenEffect]:
        """Probability, log-probability (nats) and raw logit change of each of `tokens` at
        `position` of batch row `row`, intervened − baseline."""
        return token_effects(self.baseline_logits[row, position],
                             self.intervened_logits[row, position], tokens, str)

    def logit_diff(self, token: int, position: int = -1, row: int = 0) -> float:
        return self.token_effects([token], position, row)[0].logit_diff

    def logprob_diff(self, token: int, position: int = -1, row: int = 0) -> float:
        return self.token_effects([token], position, row)[0].logprob_diff

    def prob_diff(self, token: int, position: int = -1, row: int = 0) -> float:
        return self.token_effects([token], position, row)[0].prob_diff


@attrs.define
class StateAblationResult(_StateResult):
    """Effect of a state knockout (the key-value write skipped at `positions`)."""


@attrs.define
class StateSteeringResult(_StateResult):
    """Effect of state steering (the key-value write at `positions` scaled by `scale`)."""

    scale: float = 1.0


def _logits(model: Any, ids: torch.Tensor, hooks: HookSpec) -> torch.Tensor:
    return model.forward(ids, hooks).output.detach().float().cpu()


def run_state_knockout(model: Any, ids: torch.Tensor, spec: StateKnockoutSpec,
                       baseline: torch.Tensor | None = None) -> StateAblationResult:
    """Forward `ids` [batch, seq] with and without `spec` (an MIModel on a recurrent backend)."""
    model.require(StateInterventions, "run_state_knockout")
    base = baseline if baseline is not None else _logits(model, ids, HookSpec())
    out = _logits(model, ids, HookSpec().set_state_knockout(spec))
    return StateAblationResult(base, out, list(spec.positions),
                               None if spec.target_layers is None else list(spec.target_layers))


def run_state_steering(model: Any, ids: torch.Tensor, spec: StateSteeringSpec,
                       baseline: torch.Tensor | None = None) -> StateSteeringResult:
    """Forward `ids` with and without the steering `spec`."""
    model.require(StateInterventions, "run_state_steering")
    base = baseline if baseline is not None else _logits(model, ids, HookSpec())
    out = _logits(model, ids, HookSpec().set_state_steering(spec))
    return StateSteeringResult(base, out, list(spec.positions),
                               None if spec.target_layers is None else list(spec.target_layers),
                               scale=spec.scale)
