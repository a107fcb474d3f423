"""The attention view: every head of one layer, hover a token to see what it attends to; also
for a recurrent layer's effective attention (:func:`effective_attention_html`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from mi_core.plugin import ConfigError
from mi_core.viz._page import f32, prompt_text, write_page


def attention_html(tokens: Sequence[str], pattern: torch.Tensor, path: str | Path,
                   layer: int | None = None, head: int | None = None,
                   *, title: str | None = None, model_name: str = "", top_k: int = 10,
                   prompt: str | None = None) -> Path:
    """Write the attention page.

    pattern: [heads, seq_q, seq_k] post-softmax (e.g. ``cache["pattern", layer][0]``), or
    [seq_q, seq_k] for one head. `head`: the head selected when the page opens (None = the
    mean over heads). `prompt`: the text shown above (default: the tokens joined).
    Returns the path written.
    """
    p = pattern.detach().float()
    if p.dim() == 4 and p.shape[0] == 1:
        p = p[0]
    if p.dim() == 2:
        p = p[None]
    if p.dim() != 3 or p.shape[1] != len(tokens) or p.shape[2] != len(tokens):
        raise ConfigError(f"attention_html: pattern must be [heads, {len(tokens)}, {len(tokens)}] "
                          f"for {len(tokens)} tokens, got {list(pattern.shape)}")
    n = p.shape[0]
    if head is not None and not 0 <= head < n:
        raise ConfigError(f"attention_html: head {head} out of range 0..{n - 1}")
    where = f"layer {layer}" if layer is not None else "attention"
    sub = ", ".join(x for x in (model_name, f"{n} heads", f"{len(tokens)} tokens") if x)
    data = {"tokens": list(tokens), "pattern": f32(p), "layer": layer,
            "head_labels": [f"L{layer}H{h}" if layer is not None else f"H{h}" for h in range(n)],
            "initial_head": -1 if head is None else int(head), "top_k": int(top_k)}
    return write_page(path, "attention", title or f"attention patterns, {where}", data, sub,
                      prompt if prompt is not None else prompt_text(tokens))


def effective_attention_html(tokens: Sequence[str], matrix: torch.Tensor, path: str | Path,
                             layer: int | None = None, head: int | None = None, *,
                             title: str | None = None, model_name: str = "", top_k: int = 10,
                             prompt: str | None = None) -> Path:
    """The attention page for a recurrent layer's effective attention A ([heads, seq, seq],
    signed, with A @ x = y): drawn as |A| normalised per query row, which says how much of
    each output's magnitude comes from each source token (the exact signed matrix is the
    hook's). Arguments as :func:`attention_html`."""
    a = matrix.detach().float()
    mag = a.abs()
    weights = mag / mag.sum(-1, keepdim=True).clamp_min(1e-30)
    where = f"layer {layer}" if layer is not None else "a recurrent layer"
    return attention_html(tokens, weights, path, layer, head, model_name=model_name,
                          top_k=top_k, prompt=prompt,
                          title=title or f"effective attention (|A| row-normalised), {where}")
