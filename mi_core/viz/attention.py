"""The attention view: every head of one layer as a selectable thumbnail, the selected head
large with its tokens on both axes, and the prompt coloured by what a query attends to; also
for a recurrent layer's effective attention (:func:`effective_attention_html`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from mi_core.plugin import ConfigError
from mi_core.viz._page import f32, prompt_text, write_page
from mi_core.viz._safe import MAX_VALUES, check_size, check_tokens

_WHERE = "attention_html"


def attention_html(tokens: Sequence[str], pattern: torch.Tensor, path: str | Path,
                   layer: int | None = None, head: int | None = None,
                   *, title: str | None = None, model_name: str = "", top_k: int = 10,
                   prompt: str | None = None, subtitle: str = "") -> Path:
    """Write the attention page.

    pattern: [heads, seq_q, seq_k] post-softmax (e.g. ``cache["pattern", layer][0]``), or
    [seq_q, seq_k] for one head. `head`: the head selected when the page opens (None = the
    mean over heads). `prompt`: the text shown above (default: the tokens joined).
    Returns the path written.
    """
    tokens = check_tokens(tokens, _WHERE)
    if not isinstance(pattern, torch.Tensor):
        raise ConfigError(f"{_WHERE}: pattern must be a tensor [heads, seq, seq], got "
                          f"{type(pattern).__name__}")
    p = pattern.detach().float().cpu()
    if p.dim() == 4 and p.shape[0] == 1:
        p = p[0]
    if p.dim() == 2:
        p = p[None]
    if p.dim() != 3 or p.shape[1] != len(tokens) or p.shape[2] != len(tokens):
        raise ConfigError(f"{_WHERE}: pattern must be [heads, {len(tokens)}, {len(tokens)}] "
                          f"for {len(tokens)} tokens, got {list(pattern.shape)}")
    n = p.shape[0]
    if n == 0:
        raise ConfigError(f"{_WHERE}: pattern has no heads")
    check_size(p.numel(), MAX_VALUES, "attention weights", _WHERE,
               "pass fewer heads (pattern[heads]) or a shorter prompt")
    if head is not None and not 0 <= head < n:
        raise ConfigError(f"{_WHERE}: head {head} out of range 0..{n - 1}")
    prefix = f"L{layer}" if layer is not None else ""
    data = {"tokens": tokens, "pattern": f32(p), "layer": layer,
            "head_labels": [f"{prefix}H{h}" for h in range(n)],
            "initial_head": -1 if head is None else int(head), "top_k": int(top_k)}
    where = f"layer {layer}" if layer is not None else "one layer"
    sub = subtitle or ", ".join(x for x in (
        f"attention pattern (post-softmax) of {where}, {n} heads", f"{len(tokens)} tokens",
        "rows: query (attending), columns: key (attended to)") if x)
    head_t = f"attention, {where}" + (f", {model_name}" if model_name else "")
    return write_page(path, "attention", title or head_t, data, sub,
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
    sub = (f"effective attention of {where} (|A| normalised per query row; the signed "
           f"matrix is the hook's), {weights.shape[-3] if weights.dim() > 2 else 1} heads, "
           f"{len(tokens)} tokens, rows: query, columns: source token")
    return attention_html(tokens, weights, path, layer, head, model_name=model_name,
                          top_k=top_k, prompt=prompt, subtitle=sub,
                          title=title or f"effective attention (|A| row-normalised), {where}")
