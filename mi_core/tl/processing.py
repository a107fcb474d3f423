"""Weight processing at load, as TransformerLens' ``from_pretrained`` decides it: the flags an
architecture cannot take are turned off with a warning (TransformerLens does so for
soft-capped logits, post-norm and shortformer models) instead of refusing the model."""

from __future__ import annotations

import logging
from typing import Any

from mi_core import MIError


def unembed_centring(cfg: Any, center_unembed: bool) -> bool:
    """``center_unembed`` unless the logits are soft-capped (the cap is not invariant to the
    per-position shift centring adds), with TransformerLens' warning."""
    if cfg.output_logits_soft_cap > 0.0 and center_unembed:
        logging.warning(
            "You tried to specify center_unembed=True for a model using logit softcap, but "
            "this can't be done! Softcapping is not invariant upon adding a constant "
            "Setting center_unembed=False instead.")
        return False
    return center_unembed


def process_at_load(model: Any, flags: dict[str, bool]) -> None:
    """``model.process_weights_(**flags)``; where the backend refuses folding, centring or
    value-bias folding (before any weight changed: mixture-of-experts, sequence-mixer and
    Laurel layers; attention sinks), the model loads without the refused flags, with a
    warning naming why."""
    drops = (("fold_ln", "center_writing_weights"), ("fold_value_biases",),
             ("fold_ln", "center_writing_weights", "fold_value_biases"))
    try:
        model.process_weights_(**flags)
        return
    except MIError as exc:
        first = exc
    for names in drops:
        if not any(flags.get(n) for n in names):
            continue
        try:
            model.process_weights_(**{**flags, **{n: False for n in names}})
        except MIError:
            continue
        logging.warning(f"{first}. Setting {', '.join(f'{n}=False' for n in names)}.")
        return
    raise first
