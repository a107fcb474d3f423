"""Feature activations over a batch of prompts, and the top-activating positions per feature."""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import torch

from mi_core.plugin import DictionaryError, HookSpec, SparseActivations, progress
from mi_sae.sae import SparseAutoencoder


@attrs.define
class FeatureExample:
    """One activating position: prompt index, token position, token text, activation."""

    prompt: int
    position: int
    token: str | None
    value: float


@attrs.define
class FeatureCapture:
    """Sparse feature activations per prompt (padding removed).

    tokens[i]: ids of prompt i; indices[i], values[i]: [seq_i, k] (values descending).
    """

    hook_point: str
    d_sae: int
    tokens: list[list[int]]
    indices: list[torch.Tensor]
    values: list[torch.Tensor]

    def sparse(self, prompt: int) -> SparseActivations:
        return SparseActivations(indices=self.indices[prompt], values=self.values[prompt],
                                 d_sae=self.d_sae)

    def feature_values(self, feature: int) -> list[torch.Tensor]:
        """Feature `feature`'s activation at every position: one [seq_i] tensor per prompt."""
        return [torch.where(i == feature, v, torch.zeros_like(v)).sum(-1)
                for i, v in zip(self.indices, self.values)]


def capture_features(model: Any, sae: SparseAutoencoder, prompts: Sequence[str] | torch.Tensor,
                     batch_size: int = 8, k: int | None = None) -> FeatureCapture:
    """Encode the SAE's hook activations for every prompt (strings or ids [n, seq]).

    Strings are left-padded per batch; `k` keeps the top-k features per position (None:
    the SAE's own k, or every active feature).
    """
    sae.check_model(model)
    hp = sae.require_hook()
    spec = HookSpec().capture(hp)
    n = len(prompts)
    out = FeatureCapture(hook_point=str(hp), d_sae=sae.d_sae, tokens=[], indices=[], values=[])
    for start in progress(range(0, n, batch_size), "SAE features", unit="batch"):
        chunk = prompts[start:start + batch_size]
        if isinstance(chunk, torch.Tensor):
            ids, mask = chunk, torch.ones_like(chunk)
        else:
            ids, mask = model.to_tokens_padded(list(chunk), side="left")
        cache = model.forward(ids, spec, attention_mask=None if bool(mask.all()) else mask)
        sa = sae.encode_sparse(cache[hp], k)
        for row in range(ids.shape[0]):
            keep = mask[row].bool().to(sa.indices.device)
            out.tokens.append(ids[row][keep.to(ids.device)].tolist())
            out.indices.append(sa.indices[row][keep].cpu())
            out.values.append(sa.values[row][keep].cpu())
    return out


def top_activating(capture: FeatureCapture, feature: int, n: int = 10,
                   model: Any = None) -> list[FeatureExample]:
    """The `n` positions where `feature` is most active (token text when `model` has a tokenizer)."""
    if not 0 <= feature < capture.d_sae:
        raise DictionaryError(f"feature {feature} out of range [0, {capture.d_sae})")
    per = capture.feature_values(feature)
    if not per:
        return []
    flat = torch.cat(per)
    owner = torch.cat([torch.full((len(v),), i) for i, v in enumerate(per)])
    pos = torch.cat([torch.arange(len(v)) for v in per])
    top = torch.topk(flat, min(n, flat.numel())).indices
    tok = getattr(getattr(model, "backend", None), "tokenizer", None) if model is not None else None
    examples = []
    for t in top.tolist():
        if float(flat[t]) <= 0:
            break
        p, q = int(owner[t]), int(pos[t])
        text = tok.decode([capture.tokens[p][q]]) if tok is not None else None
        examples.append(FeatureExample(prompt=p, position=q, token=text, value=float(flat[t])))
    return examples
