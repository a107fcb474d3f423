"""TransformerLens' key-value cache for ``model(tokens, past_kv_cache=cache)``
(``transformer_lens.past_key_value_caching.HookedTransformerKeyValueCache``, TransformerLens
3's ``TransformerLensKeyValueCache``), over the kernel's own KV cache.

``HookedTransformerKeyValueCache.init_cache(model.cfg, device, batch_size)`` makes an empty
cache; each forward given it runs only the new tokens after what it holds (positions
continue, keys and values are appended in place) and keeps the attention mask seen so far
(``previous_attention_mask``), as TransformerLens' does. The keys and values live in the
backend's cache (made by the first forward that uses this one), so TransformerLens' per-layer
``entries`` (``past_keys`` / ``past_values`` tensors) are not provided, nor ``freeze()``
(running on a cache without extending it): both raise a typed error.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from mi_core import InputError
from mi_core.plugin import KVCachedGeneration, has_capability
from mi_core.tl.utils import TLCapabilityError, get_attention_mask


class HookedTransformerKeyValueCache:
    """The attention mask seen so far and the kernel's KV cache for `batch_size` rows."""

    def __init__(self, batch_size: int = 1, device: Any = None) -> None:
        self.batch_size = batch_size
        #: [batch, pos_so_far], as TransformerLens' (int; ones where a token is real)
        self.previous_attention_mask = torch.empty((batch_size, 0), dtype=torch.int,
                                                   device=device)
        self.frozen = False
        self._past: Any = None  # the backend's cache, made by the first forward
        self._model: Any = None

    @classmethod
    def init_cache(cls, cfg: Any, device: Any = None,
                   batch_size: int = 1) -> "HookedTransformerKeyValueCache":
        """An empty cache for `batch_size` sequences (`cfg`: the model's config)."""
        return cls(batch_size, device if device is not None else getattr(cfg, "device", None))

    def freeze(self) -> None:
        raise TLCapabilityError("HookedTransformerKeyValueCache.freeze(): a forward that reads "
                                "the cache without extending it is not supported (the kernel's "
                                "KV cache always appends): run the prefix again instead")

    def unfreeze(self) -> None:
        self.frozen = False

    def append_attention_mask(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The mask of everything so far: the previous one then `attention_mask` [batch,
        new_tokens] (kept as the new previous one)."""
        attention_mask = attention_mask.to(self.previous_attention_mask.device)
        updated = torch.cat([self.previous_attention_mask, attention_mask], dim=-1)
        self.previous_attention_mask = updated
        return updated

    @property
    def entries(self) -> Any:
        raise TLCapabilityError("HookedTransformerKeyValueCache.entries: the keys and values "
                                "are the kernel's KV cache, not per-layer tensors here")

    def __getitem__(self, idx: int) -> Any:
        return self.entries[idx]

    def use(self, model: Any, tokens: torch.Tensor, attention_mask: Optional[torch.Tensor],
            prepend_bos: bool) -> tuple[torch.Tensor, Any]:
        """(the mask of every position so far, the backend's cache) for a forward of `model`
        on `tokens` [batch, new_tokens] after what this cache holds; the mask of the new
        tokens is `attention_mask`, else TransformerLens' (pads of the tokenizer masked)."""
        if self._model is None:
            if not has_capability(model.mi_model.backend, KVCachedGeneration):
                raise TLCapabilityError("past_kv_cache: this backend has no KV cache")
            self._model, self._past = model, model.mi_model.backend.new_past(self.batch_size)
        elif self._model is not model:
            raise InputError("past_kv_cache: this cache was filled by another model")
        if tokens.shape[0] != self.batch_size:
            raise InputError(f"past_kv_cache: made for batch {self.batch_size}, got tokens of "
                             f"shape {tuple(tokens.shape)}")
        if attention_mask is None:
            attention_mask = torch.ones_like(tokens) if model.tokenizer is None else \
                get_attention_mask(model.tokenizer, tokens, prepend_bos)
        return self.append_attention_mask(attention_mask).to(tokens.device), self._past


#: TransformerLens 3's name of the same cache
TransformerLensKeyValueCache = HookedTransformerKeyValueCache

__all__ = ["HookedTransformerKeyValueCache", "TransformerLensKeyValueCache"]
