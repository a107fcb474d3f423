"""TransformerLens' arithmetic in the forwards of :class:`mi_core.tl.HookedTransformer`.

mi-core's kernel computes as transformers does. TransformerLens computes a few steps in
another order, so the same weights give activations that differ by F32 rounding (~1e-7 of
their scale): harmless, except where a figure divides by a small difference (a patching
metric's clean - corrupted logit difference magnifies it to ~1e-4). For the forwards of the
TransformerLens layer the kernel is asked for TransformerLens' order where it offers one, and
the rest is recomputed at the hook points (interventions in the forward's HookSpec, so
:class:`mi_core.MIModel`'s own forwards are unchanged):

- **norms** divide by the scale, ``x / sqrt(mean(x^2) + eps)`` (TransformerLens' ``RMSNorm``,
  ``LayerNormPre``), where transformers multiplies by ``rsqrt``: an identity intervention at
  each ``hook_scale`` makes the kernel take its divide-by-the-scale path;
- **attention** is explicit (scores, softmax, pattern times values), not a fused kernel: an
  identity intervention at ``attn.hook_attn_scores``;
- **rotary** tables are TransformerLens' (angles ``pos / base ** (2i / rot)``, where
  transformers computes ``pos * inv_freq``): ``hook_rot_q`` / ``hook_rot_k`` rotate the
  layer's ``hook_q`` / ``hook_k`` (after their hooks) with them, as TransformerLens'
  ``apply_rotary`` does. Plain RoPE only (no scaling, no q/k norm after the rotation): other
  kinds keep the kernel's rotation (:func:`rotary_of` returns nothing for them);
- with ``use_attn_result``, the per-head results are TransformerLens' ``(z * W_O)`` summed
  over ``d_head`` (a multiply and a sum, where the kernel uses a matrix product); the kernel
  then sums them over heads and adds ``b_O``, as TransformerLens does.
- **padded positions** (a list of texts) are TransformerLens' (:func:`pad_as_transformerlens`):
  zero positional embedding, no query attends to a pad, a row with nothing to attend to has a
  zero pattern; the real positions do not change.

Measured (tests/tl/test_tl_arithmetic.py): on the embedded checkpoint's first layers every
activation and the logits of the TransformerLens layer equal TransformerLens' bit for bit.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import attrs
import torch

from mi_core import HookSpec


@attrs.frozen
class Rotary:
    """One layer's rotary embedding as TransformerLens' config states it."""

    base: float  # cfg.rotary_base
    dim: int  # cfg.rotary_dim (the leading dims of each head rotate)
    adjacent_pairs: bool  # cfg.rotary_adjacent_pairs, or the two halves


def rotary_of(model: Any) -> dict[int, Rotary]:
    """layer -> its rotary embedding, for the layers whose rotation TransformerLens'
    ``calculate_sin_cos_rotary`` default branch describes (plain RoPE); empty when the model
    has none, or its backend does not say (read from the transformer backend's config; a
    backend without these fields keeps its own rotation)."""
    be = getattr(model, "backend", None)
    c = getattr(be, "config", None)
    settings = getattr(be, "settings", None)
    ropes = getattr(c, "ropes", None)
    if c is None or settings is None or not ropes or getattr(c, "mla", None) is not None:
        return {}
    if getattr(c, "qk_norm_after_rope", False) or (
            getattr(c, "rope_float32", False) and getattr(be, "dtype", None) != torch.float32):
        return {}
    try:
        dim = int(c.rot_dim)
        out = {}
        for i, s in enumerate(settings):
            if getattr(s, "rope", None) is None:
                continue  # no positions in this layer (NoPE)
            rope = ropes[s.rope]
            if getattr(rope.scaling, "value", None) != "default" or \
                    rope.attention_factor not in (None, 1.0) or getattr(s, "rope_tail", 0):
                continue
            out[i] = Rotary(float(rope.theta), dim, bool(s.interleaved))
    except (AttributeError, IndexError, TypeError, ValueError):
        return {}
    return out


#: (base, dim, adjacent pairs, rows, dtype, device) -> (sin, cos) [rows, dim]
_TABLES: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def sin_cos(r: Rotary, rows: int, dtype: torch.dtype, device: torch.device
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """TransformerLens' ``calculate_sin_cos_rotary`` (the default branch): sin, cos
    [rows, dim], computed as it computes them (float32 angles ``pos / freq``)."""
    key = (r.base, r.dim, r.adjacent_pairs, rows, dtype, str(device))
    if key not in _TABLES:
        high = torch.float64 if dtype == torch.float64 else torch.float32
        pos = torch.arange(rows, dtype=high)
        dim = torch.arange(r.dim // 2, dtype=high)
        freq = r.base ** (dim / (r.dim / 2))
        freq = freq.repeat_interleave(2) if r.adjacent_pairs else freq.repeat(2)
        angles = pos[:, None] / freq[None, :]
        _TABLES.clear() if len(_TABLES) > 16 else None
        _TABLES[key] = (torch.sin(angles).to(dtype).to(device),
                        torch.cos(angles).to(dtype).to(device))
    return _TABLES[key]


def table_rows(n_ctx: int, needed: int) -> int:
    """The rows of TransformerLens' rotary tables for positions up to `needed`: 2048 (or
    n_ctx), doubled (up to n_ctx) when a longer sequence needs more."""
    rows = min(n_ctx, 2048)
    if needed > rows:
        rows = min(n_ctx, max(needed, 2 * rows))
    return max(rows, needed)


def rotate(x: torch.Tensor, r: Rotary, positions: torch.Tensor, n_ctx: int) -> torch.Tensor:
    """x [batch, pos, heads, d_head] rotated as TransformerLens' ``apply_rotary``;
    `positions` [batch or 1, pos] (long)."""
    sin, cos = sin_cos(r, table_rows(n_ctx, int(positions.max()) + 1), x.dtype, x.device)
    x_rot, x_pass = x[..., :r.dim], x[..., r.dim:]
    x_flip = x_rot.clone()  # TransformerLens' rotate_every_two
    if r.adjacent_pairs:
        x_flip[..., ::2] = -x_rot[..., 1::2]
        x_flip[..., 1::2] = x_rot[..., ::2]
    else:
        n = x_rot.shape[-1] // 2
        x_flip[..., :n] = -x_rot[..., n:]
        x_flip[..., n:] = x_rot[..., :n]
    x_rotated = x_rot * cos[positions][:, :, None, :] + x_flip * sin[positions][:, :, None, :]
    return torch.cat([x_rotated, x_pass], dim=-1)


def positions_of(ids: torch.Tensor, mask: Optional[torch.Tensor], offset: int
                 ) -> torch.Tensor:
    """Each token's position, as TransformerLens gives it: from the attention mask (covering
    the cached tokens too) where there is one, else ``offset`` + 0, 1, ..."""
    seq = ids.shape[1]
    if mask is not None:
        return (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -seq:].to(ids.device)
    return torch.arange(offset, offset + seq, device=ids.device)[None]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class Plan:
    """The interventions that make one forward compute as TransformerLens does: `before`
    (added to the spec ahead of the user's hooks at a point: the recomputed values those
    hooks then see) and :meth:`add_after` (after them: identities that pick the kernel's
    path, and the values the recomputations read)."""

    def __init__(self, names: set[str], blocks: range, rotary: dict[int, Rotary],
                 positions: Callable[[], torch.Tensor], n_ctx: int,
                 w_o: Optional[Callable[[int], torch.Tensor]],
                 wire: Callable[[str, torch.Tensor], torch.Tensor]) -> None:
        self.names, self.blocks, self.rotary = names, blocks, rotary
        self.positions, self.n_ctx, self.w_o, self.wire = positions, n_ctx, w_o, wire
        self.kept: dict[str, torch.Tensor] = {}
        self._pos: Optional[torch.Tensor] = None
        #: points whose value the recomputations read: their backward hooks go on that
        #: value (`wire`), not on the kernel's copy, which the forward no longer uses
        self.wired: set[str] = set()
        for i in blocks:
            a = f"blocks.{i}.attn."
            if self._rotates(i):
                self.wired |= {a + "hook_q", a + "hook_k"}
            if self._results(i):
                self.wired.add(a + "hook_z")

    def _rotates(self, i: int) -> bool:
        a = f"blocks.{i}.attn."
        return i in self.rotary and {a + "hook_rot_q", a + "hook_q", a + "hook_rot_k",
                                     a + "hook_k"} <= self.names

    def _results(self, i: int) -> bool:
        return self.w_o is not None and f"blocks.{i}.attn.hook_result" in self.names

    def _keep(self, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def keep(x: torch.Tensor) -> torch.Tensor:
            x = self.wire(name, x)
            self.kept[name] = x
            return x
        return keep

    def _rotated(self, layer: int, source: str) -> Callable[[torch.Tensor], torch.Tensor]:
        r = self.rotary[layer]

        def rotated(x: torch.Tensor) -> torch.Tensor:
            if self._pos is None:
                self._pos = self.positions()
            return rotate(self.kept.pop(source), r, self._pos, self.n_ctx)
        return rotated

    def _result(self, layer: int, source: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def result(x: torch.Tensor) -> torch.Tensor:
            # in TransformerLens' memory layouts (they decide the order of the sum): z as
            # its pattern @ v, [batch, heads, pos, d_head] seen as [batch, pos, heads, d_head],
            # and W_O a contiguous [heads, d_head, d_model] parameter
            z = self.kept.pop(source).transpose(1, 2).contiguous().transpose(1, 2)
            w = self.w_o(layer).to(z.dtype).contiguous()  # type: ignore[misc]
            return (z[..., None] * w[None, None]).sum(-2)
        return result

    def before(self, spec: HookSpec) -> None:
        for i in self.blocks:
            a = f"blocks.{i}.attn."
            if self._rotates(i):
                spec.intervene(a + "hook_rot_q", self._rotated(i, a + "hook_q"))
                spec.intervene(a + "hook_rot_k", self._rotated(i, a + "hook_k"))
            if self._results(i):
                spec.intervene(a + "hook_result", self._result(i, a + "hook_z"))

    def add_after(self, spec: HookSpec) -> None:
        for i in self.blocks:
            b, a = f"blocks.{i}.", f"blocks.{i}.attn."
            for name in (b + "ln1.hook_scale", b + "ln2.hook_scale", a + "hook_attn_scores"):
                if name in self.names:
                    spec.intervene(name, _identity)
            if self._rotates(i):
                spec.intervene(a + "hook_q", self._keep(a + "hook_q"))
                spec.intervene(a + "hook_k", self._keep(a + "hook_k"))
            if self._results(i):
                spec.intervene(a + "hook_z", self._keep(a + "hook_z"))
        if "ln_final.hook_scale" in self.names:
            spec.intervene("ln_final.hook_scale", _identity)


def pad_as_transformerlens(spec: HookSpec, names: set[str], blocks: range,
                           mask: Optional[torch.Tensor]) -> None:
    """Padded positions as TransformerLens computes them (real positions are unaffected):
    their positional embedding is zero, no query attends to a padded key (a left pad's own
    row is then all ``-inf``) and a row with nothing to attend to has a zero pattern
    (TransformerLens replaces the softmax's NaN by 0). `mask` [batch, past + pos] (1 = real)."""
    if mask is None or bool(mask.bool().all()):
        return
    pad = ~mask.bool()

    def pos_embed(x: torch.Tensor) -> torch.Tensor:  # [batch, pos, d_model]
        if x.dim() != 3:  # another layout: left as the kernel computed it
            return x
        return x.masked_fill(pad[:, -x.shape[1]:, None].to(x.device), 0.0)

    def scores(x: torch.Tensor) -> torch.Tensor:  # [batch, heads, query, key]
        if x.dim() != 4:
            return x
        return x.masked_fill(pad[:, None, None, -x.shape[-1]:].to(x.device), float("-inf"))

    def pattern(x: torch.Tensor) -> torch.Tensor:
        return torch.where(torch.isnan(x), torch.zeros_like(x), x)

    if "hook_pos_embed" in names:
        spec.intervene("hook_pos_embed", pos_embed)
    for i in blocks:
        a = f"blocks.{i}.attn."
        if a + "hook_attn_scores" in names and a + "hook_pattern" in names:
            spec.intervene(a + "hook_attn_scores", scores)
            spec.intervene(a + "hook_pattern", pattern)
