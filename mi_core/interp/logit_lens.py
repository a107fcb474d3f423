"""Logit lens: project the residual stream after each layer through the model's final norm
and unembedding (``model.project_to_vocab``) and read off the predicted tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import attrs
import torch

from mi_core.plugin import HookPoint, HookSpec, MIModel, require_points, view
from mi_core.interp._common import as_ids, check_layers, norm_position, resolve_token, token_str


@attrs.define
class TokenPrediction:
    """One token at one lens point: id, text, probability, logit and rank (0 = top-1)."""

    token_id: int
    token: str
    prob: float
    logit: float
    rank: int


@attrs.define
class LayerPrediction:
    """The lens at one point: ``label`` e.g. "L3" (resid_post) or "L3.mid" (resid_mid)."""

    label: str
    layer: int
    point: str
    top: list[TokenPrediction]
    targets: list[TokenPrediction] = attrs.field(factory=list)


@attrs.define
class LogitLensResult:
    """Per-point predictions at one position, in execution order (last = model output)."""

    prompt_tokens: list[str]
    position: int
    points: list[LayerPrediction]

    def top1(self) -> list[str]:
        return [p.top[0].token for p in self.points]

    def first_point_with_top1(self, token_id: int) -> LayerPrediction | None:
        """The earliest point whose top-1 is `token_id` (None when never)."""
        return next((p for p in self.points if p.top[0].token_id == token_id), None)

    def target_trajectory(self, token_id: int) -> list[tuple[str, float, int]]:
        """(label, prob, rank) of `token_id` at each point (targets must include it)."""
        out = []
        for p in self.points:
            t = next(t for t in p.targets if t.token_id == token_id)
            out.append((p.label, t.prob, t.rank))
        return out

    def format_table(self) -> str:
        """The lens as text; ranks are printed 1-based ("rank 1" = the top token), as on the
        pages and pictures (the ``rank`` fields are 0-based indices)."""
        k = len(self.points[0].top) if self.points else 0
        lines = [f"{'point':>8}  " + "  ".join(f"top{i + 1:<14}" for i in range(k))]
        for p in self.points:
            cells = [f"{t.token!r:>9} {t.prob:4.2f}" for t in p.top]
            tg = "  ".join(f"[{t.token!r} p={t.prob:.3f} rank {t.rank + 1}]" for t in p.targets)
            lines.append(f"{p.label:>8}  " + "  ".join(f"{c:<16}" for c in cells) + ("  " + tg if tg else ""))
        if any(p.targets for p in self.points):
            lines.append("(rank 1 = the top token)")
        return "\n".join(lines)

    def to_html(self, path: str | Path, title: str | None = None) -> Path:
        """An interactive page of this position's lens (hover for top-k and probabilities);
        :func:`mi_core.interp.logit_lens_grid` gives every position at once."""
        return view("logit_lens")(self, path, title=title)


@attrs.define
class LogitLensAnalysis:
    """Configuration of a logit-lens run; call :meth:`run`.

    ``layers``: None = all; ``include_mid``: also lens ``hook_resid_mid`` of each layer;
    ``k``: top-k per point; ``targets``: token ids or single-token strings to track.
    """

    k: int = 5
    layers: list[int] | None = None
    include_mid: bool = False
    targets: list[int | str] = attrs.field(factory=list)

    def points(self, model: MIModel) -> list[tuple[str, int, HookPoint]]:
        out = []
        for layer in check_layers(self.layers, model.num_layers):
            if self.include_mid:
                out.append((f"L{layer}.mid", layer, HookPoint.resid_mid(layer)))
            out.append((f"L{layer}", layer, HookPoint.resid_post(layer)))
        return out

    def run(self, model: MIModel, prompt: Any, position: int = -1) -> LogitLensResult:
        """Lens `prompt` (text or ids [1, seq]) at `position` (default: last)."""
        ids = as_ids(model, prompt)
        pos = norm_position(position, ids.shape[1])
        pts = self.points(model)
        require_points(model, [p for _, _, p in pts])
        cache = model.forward(ids, HookSpec().capture_all(p for _, _, p in pts))
        stack = torch.stack([cache.require(p)[0, pos] for _, _, p in pts])  # [points, d_model]
        logits = model.project_to_vocab(stack).float()  # [points, vocab]
        return lens_result(model, ids, pos, pts, logits, self.k,
                           [resolve_token(model, t) for t in self.targets])


def lens_result(model: MIModel, ids: torch.Tensor, pos: int,
                pts: Sequence[tuple[str, int, HookPoint]], logits: torch.Tensor, k: int,
                targets: Sequence[int]) -> LogitLensResult:
    probs = torch.softmax(logits, -1)
    names: dict[int, str] = {}

    def name(i: int) -> str:
        if i not in names:
            names[i] = token_str(model, i)
        return names[i]

    out = []
    for (label, layer, hp), lg, pr in zip(pts, logits, probs):
        tv, ti = pr.topk(k)
        top = [TokenPrediction(int(i), name(int(i)), float(v), float(lg[i]), r)
               for r, (v, i) in enumerate(zip(tv, ti))]
        tg = [TokenPrediction(t, name(t), float(pr[t]), float(lg[t]), int((lg > lg[t]).sum()))
              for t in targets]
        out.append(LayerPrediction(label, layer, hp.name, top, tg))
    return LogitLensResult(model.to_str_tokens(ids[0]) if model.has_tokenizer
                           else [str(i) for i in ids[0].tolist()], pos, out)
