"""Small helpers shared by the analyses: inputs, positions, layers and heads."""

from __future__ import annotations

from typing import Any, Iterable, Sequence, TypeVar

import torch

from mi_core.plugin import (  # noqa: F401  (MetricError and progress are re-exported)
    HookError, InterventionError, MetricError, MIError, TokenizerError, progress,
)

T = TypeVar("T")


def as_ids(model: Any, prompt: "str | torch.Tensor | Sequence[int]") -> torch.Tensor:
    """A prompt (text or ids) as LongTensor [batch, seq] on the model's device."""
    if isinstance(prompt, str):
        return model.to_tokens(prompt)
    return model.check_ids(prompt, "prompt")  # never a silent cast of float ids


def norm_position(pos: int, seq: int, what: str = "position") -> int:
    """Resolve a possibly negative position; InterventionError when out of range."""
    p = pos + seq if pos < 0 else pos
    if not 0 <= p < seq:
        raise InterventionError(f"{what} {pos} out of range for a sequence of {seq} tokens "
                                f"(valid: {-seq}..{seq - 1})")
    return p


def norm_positions(positions: Iterable[int] | None, seq: int, what: str = "position") -> list[int]:
    if positions is None:
        return list(range(seq))
    return [norm_position(int(p), seq, what) for p in positions]


def check_layers(layers: Iterable[int] | None, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    out = []
    for layer in layers:
        layer = int(layer)
        if not 0 <= layer < n_layers:
            raise HookError(f"layer {layer} out of range; valid layers are 0..{n_layers - 1}")
        out.append(layer)
    return out


def check_heads(heads: Iterable[int] | None, n_heads: int) -> list[int]:
    if heads is None:
        return list(range(n_heads))
    out = []
    for h in heads:
        h = int(h)
        if not 0 <= h < n_heads:
            raise InterventionError(f"head {h} out of range; valid heads are 0..{n_heads - 1}")
        out.append(h)
    return out


def token_str(model: Any, token_id: int) -> str:
    if not model.has_tokenizer:
        return f"<{token_id}>"
    try:
        return model.tokenizer.decode([int(token_id)])
    except MIError:
        return f"<{token_id}>"


def resolve_token(model: Any, token: "int | str") -> int:
    """A token id, or the single token a string encodes to (TokenizerError otherwise)."""
    if isinstance(token, int):
        if not 0 <= token < model.vocab_size:
            raise TokenizerError(f"token id {token} out of vocabulary range [0, {model.vocab_size})")
        return token
    ids = model.tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise TokenizerError(f"{token!r} is {len(ids)} tokens {ids}, expected exactly one")
    return int(ids[0])
