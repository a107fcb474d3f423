"""Recurrent-state interventions: specs only.

A recurrent backend (one that carries a state from token to token instead of attending to
a KV cache) writes a key-value outer product into its state at each position. These specs
skip (knockout) or scale (steering) that write at chosen positions, layers and heads. Backends
with the state-interventions capability (:class:`mi_core.capabilities.StateInterventions`)
apply them; on any other backend a spec is a CapabilityError before compute.
"""

from __future__ import annotations

import math
import operator

import attrs

from mi_core.errors import InterventionError


@attrs.define
class _StateSpecBase:
    positions: list[int] = attrs.field(factory=list)
    #: None means every layer.
    target_layers: list[int] | None = None
    #: None means every head of each targeted layer's recurrent mixer.
    target_heads: list[int] | None = None

    def position(self, pos: int) -> "_StateSpecBase":
        self.positions.append(_index(pos, "position"))
        return self

    def layer(self, layer: int) -> "_StateSpecBase":
        self.target_layers = [_index(layer, "layer")]
        return self

    def layers(self, layers: list[int]) -> "_StateSpecBase":
        self.target_layers = [_index(x, "layer") for x in layers]
        return self

    def heads(self, heads: list[int]) -> "_StateSpecBase":
        """Only these heads of each targeted layer (their range is the backend's to check)."""
        self.target_heads = [_index(h, "head") for h in heads]
        return self

    def layer_range(self, start: int, end: int) -> "_StateSpecBase":
        """Inclusive range, as in the seed crate."""
        start, end = _index(start, "layer_range start"), _index(end, "layer_range end")
        if end < start:
            raise InterventionError(f"layer_range({start}, {end}): end must be >= start")
        self.target_layers = list(range(start, end + 1))
        return self

    def applies_to(self, layer: int) -> bool:
        return self.target_layers is None or layer in self.target_layers

    def validate(self, num_layers: int, seq_len: int | None = None) -> None:
        for p in self.positions:
            _index(p, f"{type(self).__name__} position")
        for lay in self.target_layers or []:
            _index(lay, f"{type(self).__name__} layer")
            if not 0 <= lay < num_layers:
                raise InterventionError(
                    f"{type(self).__name__}: layer {lay} out of range [0, {num_layers - 1}]"
                )
        if any(h < 0 for h in self.target_heads or []):
            raise InterventionError(f"{type(self).__name__}: heads {self.target_heads} must be "
                                    f">= 0")
        if seq_len is not None:
            for p in self.positions:
                if not -seq_len <= p < seq_len:
                    raise InterventionError(
                        f"{type(self).__name__}: position {p} out of range for seq_len {seq_len}"
                    )


@attrs.define
class StateKnockoutSpec(_StateSpecBase):
    """Skip the key-value write into the recurrent state at `positions` (default: all layers)."""


@attrs.define
class StateSteeringSpec(_StateSpecBase):
    """Scale the key-value write at `positions` by `scale` (0 = knockout, 1 = no-op)."""

    scale: float = 1.0

    def __init__(self, scale: float = 1.0, positions: list[int] | None = None,
                 target_layers: list[int] | None = None,
                 target_heads: list[int] | None = None) -> None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale):
            raise InterventionError(f"StateSteeringSpec scale must be a finite number, got "
                                    f"{scale!r}")
        self.__attrs_init__(positions=[_index(p, "position") for p in positions or []],
                            target_layers=None if target_layers is None else
                            [_index(x, "layer") for x in target_layers],
                            target_heads=None if target_heads is None else
                            [_index(x, "head") for x in target_heads], scale=float(scale))


def _index(value: object, what: str) -> int:
    """An int position / layer (negative allowed for positions); InterventionError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # numpy / torch integers
        except TypeError:
            pass
    raise InterventionError(f"{what} must be an int, got {value!r}")
