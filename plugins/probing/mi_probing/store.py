"""Probes on an activation store written by ``mi_core.cache_activations`` (one row per token)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from mi_probing.probes import ProbeResult, fit_probe


def store_activations(store: Any, hook: str, limit: int | None = None) -> torch.Tensor:
    """The first `limit` (default all) tokens of `hook` in store order, flattened: [n, F]."""
    rows, n = [], 0
    for batch in store.batches(hook, batch_size=65536):
        rows.append(batch.reshape(batch.shape[0], -1).float())
        n += batch.shape[0]
        if limit is not None and n >= limit:
            break
    return torch.cat(rows)[:limit]


def fit_probe_on_store(store: Any, hook: str, labels: Sequence[Any], **kwargs: Any) -> ProbeResult:
    """``fit_probe`` on the store's first ``len(labels)`` tokens at `hook` (one label per token,
    aligned with ``store.tokens_of()``)."""
    x = store_activations(store, hook, len(labels))
    return fit_probe(x, labels, hook=hook, feature_shape=store.hooks[hook]["shape"], **kwargs)
