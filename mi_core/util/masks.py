"""Cached attention masks (additive: 0 keep, -inf remove), shaped [1, 1, seq_q, seq_k]."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=32)
def _causal(seq: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    m = torch.full((seq, seq), float("-inf"), dtype=dtype).triu(1)
    return m[None, None].to(device)


def create_causal_mask(seq_len: int, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[1, 1, seq, seq]: -inf above the diagonal (cached; read-only)."""
    return _causal(int(seq_len), str(torch.device(device)), dtype)


def create_generation_mask(past_len: int, new_len: int, device: str | torch.device = "cpu",
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[1, 1, new, past + new]: new queries see the whole cache and the causal part of the new
    tokens."""
    total = past_len + new_len
    q = torch.arange(past_len, total)[:, None]
    k = torch.arange(total)[None, :]
    m = torch.zeros(new_len, total, dtype=dtype)
    m[k > q] = float("-inf")
    return m[None, None].to(device)


def clear_mask_caches() -> None:
    """Drop the cached causal and knockout masks."""
    _causal.cache_clear()
    from mi_core.interp.knockout import clear_mask_cache

    clear_mask_cache()
