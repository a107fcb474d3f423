"""Checks of what a caller passes to a model: devices, dtypes, token ids, attention masks and
generation settings. Each failure is an :class:`~mi_core.InputError` (or TokenizerError for
ids outside the vocabulary) naming the argument, before any compute."""

from __future__ import annotations

import math
from typing import Any

import torch

from mi_core.errors import InputError, TokenizerError


def resolve_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device that exists and is available here; InputError otherwise."""
    if not isinstance(device, (str, torch.device)):
        raise InputError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise InputError(f"device {device!r} is not a device torch knows: {exc}") from None
    if dev.type == "cpu" or dev.type == "meta":
        return dev
    module = getattr(torch, dev.type, None)  # torch.cuda, torch.mps, torch.xpu, ...
    available = module is not None and hasattr(module, "is_available") and module.is_available()
    if not available:
        raise InputError(f"device {device!r}: {dev.type} is not available on this machine")
    count = getattr(module, "device_count", None)
    if dev.index is not None and count is not None and dev.index >= count():
        raise InputError(f"device {device!r}: this machine has {count()} {dev.type} device(s)")
    return dev


def check_dtype(dtype: Any) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"dtype must be a floating torch.dtype (e.g. torch.float32), got "
                         f"{dtype!r}")
    return dtype


def check_ids(ids: Any, vocab_size: int, device: torch.device, what: str = "ids") -> torch.Tensor:
    """Token ids as LongTensor [batch, seq] on `device`; InputError (shape, dtype, ragged,
    empty) or TokenizerError (out of the vocabulary) naming `what`."""
    if not isinstance(ids, torch.Tensor):
        try:
            ids = torch.as_tensor(ids)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise InputError(f"{what} cannot be made a [batch, seq] tensor ({exc}); rows of "
                             f"unequal length must be padded (with attention_mask)") from None
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise InputError(f"{what} must hold integer token ids, got dtype {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2:
        raise InputError(f"{what} must be [batch, seq] (or [seq]), got shape {list(ids.shape)}")
    if ids.numel() == 0:
        raise InputError(f"{what} is empty (shape {list(ids.shape)})")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        bad = ids[(ids < 0) | (ids >= vocab_size)].unique()[:5].tolist()
        raise TokenizerError(f"{what}: token ids {bad} out of vocabulary range "
                             f"[0, {vocab_size})")
    return ids.to(device=device, dtype=torch.long)


def check_mask(mask: Any, ids: torch.Tensor, device: torch.device, cached: bool = False
               ) -> torch.Tensor | None:
    """attention_mask [batch, seq] of 0/1 (bool or numeric), no all-zero row; with a cache
    (`cached`) it may also cover the cached positions, [batch, cached + seq]."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        try:
            mask = torch.as_tensor(mask)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise InputError(f"attention_mask cannot be made a tensor: {exc}") from None
    batch, seq = ids.shape
    if mask.dim() != 2 or mask.shape[0] != batch or (
            mask.shape[1] != seq and not (cached and mask.shape[1] > seq)):
        raise InputError(f"attention_mask has shape {list(mask.shape)}; ids have shape "
                         f"{list(ids.shape)} (expected the same)")
    if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
        raise InputError("attention_mask must hold only 0 (padding) and 1 (token), got "
                         f"{mask[(mask != 0) & (mask != 1)].unique()[:5].tolist()}")
    if not cached:
        empty = (mask.sum(-1) == 0).nonzero().flatten().tolist()
        if empty:
            raise InputError(f"attention_mask rows {empty[:5]} are all zero: those "
                             f"sequences have no tokens")
    return mask.to(device)


def check_max_new_tokens(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"max_new_tokens must be a non-negative int, got {n!r}")
    return n


def check_temperature(t: Any) -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise InputError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
    return float(t)


def check_left_padded(mask: torch.Tensor) -> None:
    """generate appends after the last column: every row's padding must come first."""
    gaps = (mask[:, 1:].long() < mask[:, :-1].long()).any(dim=1).nonzero().flatten().tolist()
    if gaps:
        raise InputError(f"attention_mask rows {gaps[:5]} have padding after a token (right "
                         f"padding): generate needs left padding, e.g. "
                         f"model.to_tokens_padded(texts, side='left')")
