"""SAE metrics on an activation store written by ``mi_core.cache_activations``."""

from __future__ import annotations

from typing import Any

import torch

from mi_sae.metrics import ReconstructionMetrics, activation_metrics


def store_metrics(sae: Any, store: Any, max_tokens: int = 65536, hook: str | None = None
                  ) -> ReconstructionMetrics:
    """MSE, explained variance and L0 of `sae` on up to `max_tokens` stored tokens of its hook
    point (or `hook`), read in store order."""
    name = hook or str(sae.hook_point)
    rows, n = [], 0
    for batch in store.batches(name, batch_size=min(max_tokens, 65536)):
        rows.append(batch)
        n += batch.shape[0]
        if n >= max_tokens:
            break
    x = torch.cat(rows)[:max_tokens]
    return activation_metrics(sae, x)  # the SAE casts x to its dtype
