"""What TransformerLens 3's ``TransformerBridge`` adds over ``HookedTransformer`` that its demos
use, on mi-core's :class:`~mi_core.tl.HookedTransformer` (and so on
:class:`~mi_core.tl.model_bridge.TransformerBridge`): a TransformerLens 3 demo whose loading
line becomes ``HookedTransformer.from_pretrained(path)`` keeps running its
``model.enable_compatibility_mode(...)`` line and its ``model.tl_named_parameters()`` cells.

- :meth:`~BridgeCompatMixin.enable_compatibility_mode`: HookedTransformer's weight processing
  with the bridge's flags, once (a model whose norms are already folded, e.g. loaded by
  ``from_pretrained``, is left as it is: it already is what compatibility mode makes);
- :meth:`~BridgeCompatMixin.tl_named_parameters` / ``tl_parameters``: TransformerLens-named
  weights in the bridge's order;
- ``blocks.N.hook_in`` / ``blocks.N.hook_out`` (``utils.get_act_name("in", N)``) accepted as
  names of ``hook_resid_pre`` / ``hook_resid_post`` when adding a hook (the bridge's block
  points; not in ``hook_dict`` or a cache, whose keys stay HookedTransformer's)."""

from __future__ import annotations

import re
from typing import Any, Iterator

import torch

#: the bridge's block-level names for HookedTransformer's residual points
_BLOCK_ALIASES = (
    (re.compile(r"^blocks\.(\d+)\.hook_in$"), r"blocks.\1.hook_resid_pre"),
    (re.compile(r"^blocks\.(\d+)\.hook_out$"), r"blocks.\1.hook_resid_post"),
)


class BridgeCompatMixin:
    """TransformerLens 3's bridge methods on a HookedTransformer (see the module doc)."""

    def enable_compatibility_mode(self, disable_warnings: bool = False,
                                  no_processing: bool = False, fold_ln: bool = True,
                                  center_writing_weights: bool = True,
                                  center_unembed: bool = True, fold_value_biases: bool = True,
                                  refactor_factored_attn_matrices: bool = False) -> None:
        """HookedTransformer's weight processing with these flags (the bridge's compatibility
        mode; its hook names are already HookedTransformer's here). ``no_processing``, or
        norms already folded (``cfg.normalization_type`` "LNPre" / "RMSPre": loaded by
        ``from_pretrained`` or processed before), leave the weights as they are; folding again
        would change them."""
        if no_processing or str(self.cfg.normalization_type).endswith("Pre"):
            return
        self.process_weights_(fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                              center_unembed=center_unembed,
                              refactor_factored_attn_matrices=refactor_factored_attn_matrices,
                              fold_value_biases=fold_value_biases)

    def _point(self, name: str) -> Any:
        for pattern, target in _BLOCK_ALIASES:
            if pattern.match(name):
                name = pattern.sub(target, name)
        return super()._point(name)  # type: ignore[misc]

    def tl_named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(TransformerLens name, weight) in the bridge's order: embeddings, then per block
        the attention's ``W_Q W_K W_V W_O b_Q b_K b_V b_O`` (keys and values repeated per
        query head), the MLP's ``W_in W_out b_in b_out [W_gate]``, the norms' ``w [b]``
        (ones / zeros once folded), then the final norm and the unembedding."""
        yield "embed.W_E", self.embed.W_E
        if self.cfg.positional_embedding_type == "standard":
            yield "pos_embed.W_pos", self.pos_embed.W_pos
        for i, block in enumerate(self.blocks):
            p = f"blocks.{i}."
            for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
                yield p + "attn." + n, getattr(block.attn, n)
            if not self.cfg.attn_only:
                for n in ("W_in", "W_out", "b_in", "b_out", "W_gate"):
                    w = getattr(block.mlp, n, None)
                    if w is not None:
                        yield p + "mlp." + n, w
            for ln in ("ln1",) if self.cfg.attn_only else ("ln1", "ln2"):
                yield from self._bridge_norm(p + ln, getattr(block, ln, None))
        yield from self._bridge_norm("ln_final", getattr(self, "ln_final", None))
        yield "unembed.W_U", self.unembed.W_U
        yield "unembed.b_U", self.unembed.b_U

    def tl_parameters(self) -> dict[str, torch.Tensor]:
        """TransformerLens name -> weight (:meth:`tl_named_parameters` as a dict)."""
        return dict(self.tl_named_parameters())

    def _bridge_norm(self, name: str, module: Any) -> Iterator[tuple[str, torch.Tensor]]:
        d, device = self.cfg.d_model, self.embed.W_E.device
        w, b = getattr(module, "w", None), getattr(module, "b", None)
        yield name + ".w", w if w is not None else torch.ones(d, device=device)
        if str(self.cfg.normalization_type).startswith("LN"):  # LayerNorm has a bias
            yield name + ".b", b if b is not None else torch.zeros(d, device=device)


__all__ = ["BridgeCompatMixin"]
