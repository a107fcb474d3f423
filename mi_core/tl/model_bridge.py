"""TransformerLens 3's ``transformer_lens.model_bridge``: :class:`TransformerBridge`, the
loading TransformerLens' own demos use since v3 (``TransformerBridge.boot_transformers(name)``
then ``model.enable_compatibility_mode()``), so those demos port by changing their imports
only.

TransformerLens' bridge wraps the HuggingFace module and, in compatibility mode, gives it
HookedTransformer's weight processing, hook names and numerics. Here it is the
:class:`~mi_core.tl.HookedTransformer` of the same checkpoint: :meth:`boot_transformers`
loads it unprocessed (the bridge's weights before ``enable_compatibility_mode``) with
TransformerLens' defaults (BOS prepended), :meth:`enable_compatibility_mode` runs
HookedTransformer's weight processing with the bridge's flags. What the bridge adds over
HookedTransformer that its demos use: :meth:`tl_named_parameters` / :meth:`tl_parameters`
(TransformerLens-named weights in the bridge's order) and the block points ``hook_in`` /
``hook_out`` (the residual stream entering / leaving the block, i.e. ``hook_resid_pre`` /
``hook_resid_post``; ``utils.get_act_name("in", layer)``)."""

from __future__ import annotations

import os
import re
import warnings
from typing import Any, Callable, Iterator, Optional, Union

import torch

from mi_core import CapabilityError, HookError
from mi_core.tl.hook_points import HookPoint
from mi_core.tl.hooked_transformer import _OPT_IN, HookedTransformer

#: the bridge's block-level names for HookedTransformer's residual points
_BLOCK_ALIASES = (
    (re.compile(r"^blocks\.(\d+)\.hook_in$"), r"blocks.\1.hook_resid_pre"),
    (re.compile(r"^blocks\.(\d+)\.hook_out$"), r"blocks.\1.hook_resid_post"),
)

#: boot_transformers' arguments that change nothing on a local, single-device load
_NEUTRAL = {"hf_config_overrides": None, "load_weights": True, "trust_remote_code": False,
            "model_class": None, "hf_model": None, "device_map": None, "n_devices": None,
            "max_memory": None, "n_ctx": None, "checkpoint_index": None,
            "checkpoint_value": None}


class TLBridgeHookError(HookError, ValueError):
    """A hook named explicitly at an opt-in point whose switch is off: an
    :class:`mi_core.HookError` that is also the ``ValueError`` TransformerLens' bridge raises
    (HookedTransformer raises an ``AssertionError``)."""


class TransformerBridge(HookedTransformer):
    """TransformerLens' ``TransformerBridge`` as mi-core's :class:`HookedTransformer` (see the
    module doc): build with :meth:`boot_transformers`."""

    @classmethod
    def boot_transformers(cls, model_name: str | os.PathLike[str], *, device: Any = None,
                          dtype: torch.dtype = torch.float32, tokenizer: Any = None,
                          revision: Optional[str] = None, **kwargs: Any
                          ) -> "TransformerBridge":
        """The checkpoint `model_name` (a local directory, ``.gguf`` file or hub id mi-core
        loads), weights unprocessed until :meth:`enable_compatibility_mode`, BOS prepended.
        TransformerLens' options that cannot apply (another HF model object, a device map,
        config overrides, ...) raise a :class:`mi_core.CapabilityError` naming them."""
        named = sorted(k for k, v in kwargs.items() if k not in _NEUTRAL or v != _NEUTRAL[k])
        if named:
            raise CapabilityError(
                f"TransformerBridge.boot_transformers: {', '.join(named)} not supported by "
                f"mi-core's TransformerLens layer (save other weights as a checkpoint "
                f"directory and pass its path)")
        kw = {} if revision is None else {"revision": revision}
        out = cls.from_pretrained_no_processing(model_name, device=device, dtype=dtype,
                                                tokenizer=tokenizer, **kw)
        out._layer_norm = out.cfg.normalization_type == "LN"  # its norms have biases
        return out

    def enable_compatibility_mode(self, disable_warnings: bool = False,
                                  no_processing: bool = False, fold_ln: bool = True,
                                  center_writing_weights: bool = True,
                                  center_unembed: bool = True, fold_value_biases: bool = True,
                                  refactor_factored_attn_matrices: bool = False) -> None:
        """HookedTransformer's weight processing with these flags (TransformerLens' bridge:
        its hook names are already HookedTransformer's here); ``no_processing`` keeps the
        weights as loaded. Processing twice is refused, as the weights would be folded
        again."""
        if no_processing:
            return
        if getattr(self, "_compatibility_processed", False):
            raise CapabilityError("enable_compatibility_mode: the weights are already "
                                  "processed (call it once per loaded model)")
        self.process_weights_(fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                              center_unembed=center_unembed,
                              refactor_factored_attn_matrices=refactor_factored_attn_matrices,
                              fold_value_biases=fold_value_biases)
        self._compatibility_processed = True

    def _gated(self, name: str) -> Optional[str]:
        """The switch (``use_attn_result`` ...) that is off for opt-in point `name`, or None."""
        return next((switch for suffix, switch in _OPT_IN.items()
                     if name.endswith(suffix) and not getattr(self.cfg, switch)), None)

    def check_hooks_to_add(self, hook_point: HookPoint, hook_point_name: str,
                           hook: Callable[..., Any], dir: str = "fwd",
                           is_permanent: bool = False, prepend: bool = False) -> None:
        switch = self._gated(hook_point_name)
        if switch is not None:
            raise TLBridgeHookError(f"Cannot add hook {hook_point_name} because {switch} is "
                                    f"False. Call set_{switch}(True) first.")

    def add_hook(self, name: Union[str, Callable[[str], bool]], hook: Callable[..., Any],
                 dir: str = "fwd", is_permanent: bool = False,
                 level: Optional[int] = None, prepend: bool = False) -> None:
        """As HookedTransformer's, except that a filter skips the opt-in points that are off
        (with a warning naming them) where HookedTransformer refuses them, as the bridge."""
        if isinstance(name, str) or not callable(name):
            super().add_hook(name, hook, dir, is_permanent, level, prepend)
            return
        skipped = [n for n in self.hook_dict if name(n) and self._gated(n)]
        super().add_hook(lambda n: bool(name(n)) and not self._gated(n), hook, dir,
                         is_permanent, level, prepend)
        if skipped:
            warnings.warn(f"add_hook: filter matched {len(skipped)} gated-off hook name(s) "
                          f"that were skipped: {skipped}. Call the relevant set_use_*(True) "
                          f"setter first to enable them.", stacklevel=2)

    def _point(self, name: str) -> HookPoint:
        for pattern, target in _BLOCK_ALIASES:
            if pattern.match(name):
                name = pattern.sub(target, name)
        return super()._point(name)

    def tl_named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(TransformerLens name, weight) in the bridge's order: embeddings, then per block
        the attention's ``W_Q W_K W_V W_O b_Q b_K b_V b_O`` (keys and values repeated per
        query head), the MLP's ``W_in W_out b_in b_out [W_gate]``, the norms' ``w [b]``
        (ones / zeros once folded, as TransformerLens' bridge shows), then the final norm
        and the unembedding."""
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
            for ln in ("ln1", "ln2") if not self.cfg.attn_only else ("ln1",):
                yield from self._norm(p + ln, getattr(block, ln, None))
        yield from self._norm("ln_final", getattr(self, "ln_final", None))
        yield "unembed.W_U", self.unembed.W_U
        yield "unembed.b_U", self.unembed.b_U

    def tl_parameters(self) -> dict[str, torch.Tensor]:
        """TransformerLens name -> weight (:meth:`tl_named_parameters` as a dict)."""
        return dict(self.tl_named_parameters())

    def _norm(self, name: str, module: Any) -> Iterator[tuple[str, torch.Tensor]]:
        d, layer_norm = self.cfg.d_model, getattr(self, "_layer_norm", False)
        w, b = getattr(module, "w", None), getattr(module, "b", None)
        device = self.embed.W_E.device
        yield name + ".w", w if w is not None else torch.ones(d, device=device)
        if layer_norm:
            yield name + ".b", b if b is not None else torch.zeros(d, device=device)


__all__ = ["TLBridgeHookError", "TransformerBridge"]
