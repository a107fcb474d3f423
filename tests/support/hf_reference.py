"""Reference logits from a transformers model with a PyTorch forward hook on one module."""

from __future__ import annotations

from typing import Any, Callable

import torch


def assert_matches_hf_with_hook(ours: torch.Tensor, hf: Any, ids: torch.Tensor,
                                module: torch.nn.Module, hook: Callable[..., Any],
                                atol: float = 1e-4) -> None:
    """`ours` [batch, pos, vocab] equals `hf(ids).logits` with `hook` registered as a forward
    hook on `module` (max abs diff < `atol`, rtol 0). The hook must move the logits
    (> 1e-3), or the comparison would prove nothing."""
    handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            ref = hf(ids).logits
    finally:
        handle.remove()
    with torch.no_grad():
        clean = hf(ids).logits
    assert (ref - clean).abs().max() > 1e-3
    torch.testing.assert_close(ours, ref, atol=atol, rtol=0)
