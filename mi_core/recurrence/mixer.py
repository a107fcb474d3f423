"""What a sequence mixer provides to the generic block that runs it, and the one reading of
the core's state specs (knockout / steering of the key-value write) every recurrent mixer
shares."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from mi_core.plugin import HookRun, StateKnockoutSpec, StateSteeringSpec


@runtime_checkable
class Mixer(Protocol):
    """The object a :class:`mi_core.plugin.MixerSpec`'s ``build(settings, weights, layer)``
    returns. The block that owns it (a backend's generic block) normalises the residual
    stream, hooks the result at ``blocks.{i}.<input_point>``, calls :meth:`forward`, hooks
    the output at ``blocks.{i}.hook_mixer_out`` and adds it to the residual stream.

    `points`: the mixer's own hook suffixes in execution order (``input_point`` first);
    `heads`: how many heads state knockout / steering address (``target_heads``).
    """

    points: tuple[str, ...]
    input_point: str
    heads: int

    def hook_shape(self, suffix: str, batch: int, seq: int) -> tuple[int, ...] | None:
        """The shape at ``blocks.{i}.<suffix>`` for ids [batch, seq] (-1: any length)."""

    def new_state(self, batch: int) -> Any:
        """A zero recurrent state for `batch` sequences (the block's cache slot holds it)."""

    def forward(self, x: torch.Tensor, run: HookRun, *, state: Any = None,
                active: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        """x [batch, seq, d_model] (the normalised residual) -> [batch, seq, d_model].

        `state`: a :meth:`new_state` object to read and update in place (None: start from
        zeros, keep nothing); `active` [batch, seq] bool, False at padding (no state update
        there), None without padding; `offset`: tokens the state has seen (state-spec
        positions are absolute). The state specs are ``run.spec.state_knockout`` /
        ``state_steering`` (:func:`write_scales`).
        """


def write_scales(knockout: StateKnockoutSpec | None, steering: StateSteeringSpec | None,
                 layer: int, seq: int, offset: int, heads: int, device: torch.device
                 ) -> torch.Tensor | None:
    """[seq, heads] scale of the key-value write at each position and head of this call, or
    None (all ones).

    Positions are absolute (`offset` tokens were consumed by earlier calls on the state);
    negative positions count from the end of this call. A spec's ``target_heads`` (None:
    all) picks the heads. Knockout (scale 0) wins where both apply.
    """
    s: torch.Tensor | None = None
    for spec, value in ((steering, None), (knockout, 0.0)):
        if spec is None or not spec.applies_to(layer):
            continue
        hs = list(range(heads)) if spec.target_heads is None else \
            [h for h in spec.target_heads if h < heads]
        for p in spec.positions:
            i = seq + p if p < 0 else p - offset
            if 0 <= i < seq:
                if s is None:
                    s = torch.ones(seq, heads, device=device, dtype=torch.float32)
                s[i, hs] = spec.scale if value is None else value  # type: ignore[union-attr]
    return s


def written_keys(k: torch.Tensor, scales: torch.Tensor | None,
                 active: torch.Tensor | None) -> torch.Tensor:
    """The key written into the state: k [B, T, H, K] times the write scales [T, H] and zero
    at padding (`active` [B, T] False)."""
    if scales is not None:
        k = k * scales.to(k.dtype)[None, :, :, None]
    if active is not None:
        k = k * active[:, :, None, None].to(k.dtype)
    return k
