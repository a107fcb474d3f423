"""The logit lens over every position at once (layers x positions), the data of the
interactive lens view. One forward pass; the projection to the vocabulary runs one lens
point at a time, so memory stays at [seq, vocab] whatever the number of layers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import attrs
import torch

from mi_core.plugin import HookSpec, MIModel, require_points, view
from mi_core.interp._common import as_ids, resolve_token, token_str
from mi_core.interp.logit_lens import LogitLensAnalysis


@attrs.define(eq=False)
class LogitLensGrid:
    """Top-k lens predictions at every (lens point, position).

    labels: one per lens point ("L3", "L3.mid"); tokens: the prompt's tokens;
    top_ids / top_probs: [points, seq, k]; target_ids: tracked tokens, with target_probs /
    target_ranks: [points, seq, n_targets] (rank 0 = top-1); vocab: id -> token text of
    every id that appears.
    """

    labels: list[str]
    tokens: list[str]
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    target_ids: list[int]
    target_probs: torch.Tensor
    target_ranks: torch.Tensor
    vocab: dict[int, str]
    model_name: str = ""
    prompt: str | None = None  # the text, when the lens ran on text

    def to_html(self, path: str | Path, title: str | None = None) -> Path:
        """The interactive layers x positions page (see docs/VIEWS.md)."""
        return view("logit_lens")(self, path, title=title)


def logit_lens_grid(model: MIModel, prompt: Any, k: int = 5, layers: Sequence[int] | None = None,
                    include_mid: bool = False, targets: Sequence[int | str] = ()) -> LogitLensGrid:
    """The logit lens (``LogitLensAnalysis``'s points) at every position of `prompt`."""
    ids = as_ids(model, prompt)
    pts = LogitLensAnalysis(k=k, layers=list(layers) if layers is not None else None,
                            include_mid=include_mid).points(model)
    require_points(model, [p for _, _, p in pts])
    tgt = [resolve_token(model, t) for t in targets]
    cache = model.forward(ids, HookSpec().capture_all(p for _, _, p in pts))
    top_i, top_p, t_p, t_r = [], [], [], []
    for _, _, hp in pts:
        logits = model.project_to_vocab(cache.require(hp)[0]).float()  # [seq, vocab]
        probs = torch.softmax(logits, -1)
        v, i = probs.topk(k, -1)
        top_i.append(i.cpu())
        top_p.append(v.cpu())
        if tgt:
            lt = logits[:, tgt]  # [seq, T]
            t_p.append(probs[:, tgt].cpu())
            t_r.append((logits[:, None, :] > lt[:, :, None]).sum(-1).cpu())
    seq = ids.shape[1]
    top_ids, top_probs = torch.stack(top_i), torch.stack(top_p)
    empty = torch.zeros(len(pts), seq, 0)
    ids_seen = sorted(set(top_ids.flatten().tolist()) | set(tgt))
    vocab = {i: token_str(model, i) for i in ids_seen}
    toks = (model.to_str_tokens(ids[0]) if model.has_tokenizer
            else [str(i) for i in ids[0].tolist()])
    return LogitLensGrid([lab for lab, _, _ in pts], toks, top_ids, top_probs, tgt,
                         torch.stack(t_p) if tgt else empty,
                         torch.stack(t_r) if tgt else empty.long(), vocab,
                         _short_name(getattr(model, "source", "")),
                         prompt if isinstance(prompt, str) else None)


def _short_name(source: Any) -> str:
    """A checkpoint's file or directory name (a hub id stays as it is)."""
    text = str(source)
    return Path(text).name if text and Path(text).exists() else text
