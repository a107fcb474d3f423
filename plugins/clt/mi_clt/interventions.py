"""CLT feature interventions: inject / suppress decoder vectors, and the position sweep.

The seed's protocol: cache a feature's decoder vectors at every layer it writes to
(``cache_steering_vectors_all_downstream``), then turn (feature, position, strength)
triples into a HookSpec of ``Add`` interventions at the CLT's output hooks
(``prepare_hook_injection``). Suppression subtracts a feature's own contribution
(its clean activation times its decoder vectors); injection adds strength times the decoder
vectors. ``position_sweep`` moves one injection over every position and records the
probability of a target token at the last position (the "Planning in Poems" Figure 13
experiment), all positions batched into one forward pass per chunk.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, Union

import attrs
import torch

from mi_core.plugin import Add, CltFeatureId, HookSpec, InterventionError


class TranscoderLike(Protocol):
    """What these functions use of a :class:`mi_clt.CrossLayerTranscoder` (clt.py imports this
    module, so the class is described here rather than imported back)."""

    d_model: int
    device: torch.device
    dtype: torch.dtype

    def output_hook(self, layer: int) -> Any: ...

    def target_layers(self, source_layer: int) -> range: ...

    def encode_model(self, model: object, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ...

    def cache_steering_vectors_all_downstream(self, features: Sequence[CltFeatureId]
                                              ) -> dict[Any, torch.Tensor]: ...


@attrs.frozen
class Injection:
    """Add ``strength * W_dec[feature -> t]`` at position `position` of every target layer t."""

    feature: CltFeatureId
    position: int
    strength: float


InjectionLike = Union[Injection, tuple[CltFeatureId, int, float]]


def cache_steering_vectors_all_downstream(clt: TranscoderLike,
                                          features: Sequence[CltFeatureId]
                                          ) -> dict[CltFeatureId, torch.Tensor]:
    """Read (once) each feature's decoder vectors at all layers it writes to:
    {feature: [n_targets, d_model]}, kept by the CLT for later ``prepare_hook_injection``."""
    return clt.cache_steering_vectors_all_downstream(features)


def _as_injection(x: InjectionLike) -> Injection:
    return x if isinstance(x, Injection) else Injection(*x)


def injection_deltas(clt: TranscoderLike, injections: Sequence[InjectionLike],
                     seq_len: int) -> dict[int, torch.Tensor]:
    """{target layer: delta [seq_len, d_model]} summing every injection's decoder vectors."""
    deltas: dict[int, torch.Tensor] = {}
    injs = [_as_injection(i) for i in injections]
    vecs = cache_steering_vectors_all_downstream(clt, list({i.feature: None for i in injs}))
    for inj in injs:
        if not -seq_len <= inj.position < seq_len:
            raise InterventionError(f"injection of {inj.feature} at position {inj.position}: "
                                    f"out of range for a sequence of {seq_len}")
        for j, t in enumerate(clt.target_layers(inj.feature.layer)):
            d = deltas.setdefault(t, torch.zeros(seq_len, clt.d_model, dtype=clt.dtype,
                                                 device=clt.device))
            d[inj.position] += inj.strength * vecs[inj.feature][j]
    return deltas


def prepare_hook_injection(clt: TranscoderLike, injections: Sequence[InjectionLike],
                           seq_len: int, hooks: HookSpec | None = None) -> HookSpec:
    """A HookSpec with one ``Add`` [1, seq_len, d_model] per target layer at
    ``clt.output_hook(t)`` (added to `hooks` when given)."""
    spec = hooks if hooks is not None else HookSpec()
    for t, d in sorted(injection_deltas(clt, injections, seq_len).items()):
        spec.intervene(clt.output_hook(t), Add(d.unsqueeze(0)))
    return spec


def suppression_injections(model: Any, clt: TranscoderLike, ids: torch.Tensor,
                           features: Sequence[CltFeatureId], strength: float = 1.0,
                           positions: Sequence[int] | None = None) -> list[Injection]:
    """Injections that remove `strength` times each feature's clean contribution (its
    activation on `ids` times its decoders) at `positions` (default: every position)."""
    acts, _ = clt.encode_model(model, ids)  # [L, seq, F]
    seq = acts.shape[1]
    pos = range(seq) if positions is None else positions
    out = []
    for f in features:
        for p in pos:
            a = float(acts[f.layer, p, f.index])
            if a != 0.0:
                out.append(Injection(f, p, -strength * a))
    return out


def suppress_and_inject(model: Any, clt: TranscoderLike, ids: torch.Tensor,
                        suppress: Sequence[CltFeatureId], inject: Sequence[tuple[CltFeatureId, float]],
                        position: int, suppress_strength: float = 1.0) -> HookSpec:
    """Suppress `suppress` (all positions) and inject each (feature, strength) of `inject`
    at `position`, as one HookSpec."""
    injs = suppression_injections(model, clt, ids, suppress, suppress_strength)
    injs += [Injection(f, position, s) for f, s in inject]
    return prepare_hook_injection(clt, injs, ids.shape[-1])


@attrs.define
class PositionSweepResult:
    """P(target token at the last position) with the injection at each position."""

    target_token: int
    positions: list[int]
    probabilities: list[float]
    baseline_probability: float  # no intervention
    suppressed_probability: float  # suppression only

    @property
    def best_position(self) -> int:
        return self.positions[max(range(len(self.positions)), key=self.probabilities.__getitem__)]


def position_sweep(model: Any, clt: TranscoderLike, ids: torch.Tensor, target_token: int,
                   inject: Sequence[tuple[CltFeatureId, float]],
                   suppress: Sequence[CltFeatureId] = (), positions: Sequence[int] | None = None,
                   *, suppress_strength: float = 1.0, chunk: int = 16) -> PositionSweepResult:
    """Suppress `suppress` everywhere, inject `inject` at each of `positions` (default all),
    and record the probability of `target_token` at the last position; positions run as
    the rows of batched forwards of `chunk` rows."""
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1).to(model.device)
    seq = ids.shape[1]
    pos = list(range(seq)) if positions is None else [int(p) for p in positions]

    def prob(logits: torch.Tensor) -> torch.Tensor:  # [b, seq, vocab] -> [b]
        return torch.softmax(logits[:, -1].float(), dim=-1)[:, target_token]

    with torch.no_grad():
        base = float(prob(model.forward(ids, HookSpec()).output)[0])
        sup = injection_deltas(clt, suppression_injections(model, clt, ids, suppress,
                                                           suppress_strength), seq)
        spec = HookSpec()
        for t, d in sup.items():
            spec.intervene(clt.output_hook(t), Add(d.unsqueeze(0)))
        sup_p = float(prob(model.forward(ids, spec).output)[0])
        probs: list[float] = []
        for start in range(0, len(pos), chunk):
            block = pos[start:start + chunk]
            rows: dict[int, torch.Tensor] = {}
            for r, p in enumerate(block):
                for t, d in injection_deltas(clt, [Injection(f, p, s) for f, s in inject],
                                             seq).items():
                    rows.setdefault(t, torch.zeros(len(block), seq, clt.d_model,
                                                   dtype=clt.dtype, device=clt.device))[r] += d
            spec = HookSpec()
            for t in sorted(set(rows) | set(sup)):
                total = rows.get(t, torch.zeros(len(block), seq, clt.d_model, dtype=clt.dtype))
                if t in sup:
                    total = total + sup[t].unsqueeze(0)
                spec.intervene(clt.output_hook(t), Add(total))
            probs += prob(model.forward(ids.expand(len(block), -1), spec).output).tolist()
    return PositionSweepResult(target_token=int(target_token), positions=pos,
                               probabilities=probs, baseline_probability=base,
                               suppressed_probability=sup_p)
