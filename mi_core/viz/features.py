"""The feature-activation view: SAE / transcoder / CLT features highlighted over the
prompt's tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from mi_core.plugin import ConfigError
from mi_core.viz._page import f32, prompt_text, write_page
from mi_core.viz._safe import check_tokens


def feature_activations_html(tokens: Sequence[str], acts: torch.Tensor, path: str | Path,
                             feature_ids: Sequence[Any] | None = None, max_features: int = 256,
                             title: str = "feature activations", subtitle: str = "",
                             top_k: int = 10) -> Path:
    """Write the page for activations [seq, n_features] (SAE / transcoder) or
    [n_layers, seq, n_features] (a CLT's ``encode``; features are labelled "L{layer}/{index}").

    Only features active somewhere are kept, the `max_features` with the largest |activation|
    (so a 16k-wide SAE stays a small page). `feature_ids`: the label of each column
    (default: its index). A NaN activation keeps its feature on the page (first in the
    list, shown as NaN), never silently dropped.
    """
    tokens = check_tokens(tokens, "feature_activations_html")
    if not isinstance(acts, torch.Tensor):
        raise ConfigError(f"feature_activations_html: acts must be a tensor, got "
                          f"{type(acts).__name__}")
    if int(max_features) < 1:
        raise ConfigError(f"feature_activations_html: max_features must be at least 1, got "
                          f"{max_features}")
    a = acts.detach().float().cpu()
    if a.dim() == 3 and a.shape[1] == len(tokens) and a.shape[0] != len(tokens):
        labels = [f"L{layer}/{i}" for layer in range(a.shape[0]) for i in range(a.shape[2])]
        a = a.permute(1, 0, 2).reshape(len(tokens), -1)
    elif a.dim() == 2 and a.shape[0] == len(tokens):
        labels = [str(i) for i in (feature_ids if feature_ids is not None else range(a.shape[1]))]
    else:
        raise ConfigError(f"feature_activations_html: acts must be [seq, features] or "
                          f"[layers, seq, features] with seq = {len(tokens)} tokens, got "
                          f"{list(acts.shape)}")
    if len(labels) != a.shape[1]:
        raise ConfigError(f"feature_activations_html: {len(labels)} feature_ids for "
                          f"{a.shape[1]} features")
    peak = a.abs().amax(0) if a.shape[0] else torch.zeros(a.shape[1])
    keep = ((peak > 0) | peak.isnan()).nonzero().flatten()  # NaN sorts first: worth seeing
    keep = keep[peak[keep].argsort(descending=True)[:max_features]]
    n_nan = int(a[:, keep].isnan().any(0).sum())
    sub = subtitle or (f"{len(keep)} active features shown of {a.shape[1]}, strongest first "
                       f"(largest |activation| over the prompt)"
                       + (f"; {n_nan} with NaN activations" if n_nan else ""))
    data = {"tokens": list(tokens), "acts": f32(a[:, keep]),
            "labels": [labels[int(i)] for i in keep], "top_k": int(top_k)}
    return write_page(path, "features", title, data, sub, prompt_text(tokens))


def sparse_activations_html(sa: Any, tokens: Sequence[str], path: str | Path,
                            **kw: Any) -> Path:
    """A ``SparseActivations`` ([seq, k] or [1, seq, k] indices / values) as the page, without
    materialising [seq, d_sae]: only the features that appear become columns."""
    idx, val = sa.indices.detach().cpu(), sa.values.detach().float().cpu()
    if idx.dim() == 3 and idx.shape[0] == 1:
        idx, val = idx[0], val[0]
    tokens = check_tokens(tokens, "sparse_activations_html")
    if idx.dim() != 2 or idx.shape[0] != len(tokens) or val.shape != idx.shape:
        raise ConfigError(f"sparse activations must be indices and values [seq, k] for "
                          f"{len(tokens)} tokens, got {list(sa.indices.shape)} and "
                          f"{list(sa.values.shape)}")
    feats, inv = idx.unique(return_inverse=True)
    dense = torch.zeros(idx.shape[0], len(feats))
    dense.scatter_add_(1, inv, val)
    return feature_activations_html(tokens, dense, path, feature_ids=feats.tolist(), **kw)
