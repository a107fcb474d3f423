"""TransformerLens 3's ``transformer_lens.model_bridge``: :class:`TransformerBridge`, the
loading TransformerLens' own demos use since v3 (``TransformerBridge.boot_transformers(name)``
then ``model.enable_compatibility_mode()``), so those demos port by changing their imports
only.

TransformerLens' bridge wraps the HuggingFace module and, in compatibility mode, gives it
HookedTransformer's weight processing, hook names and numerics. Here it is the
:class:`~mi_core.tl.HookedTransformer` of the same checkpoint: :meth:`boot_transformers`
loads it unprocessed (the bridge's weights before ``enable_compatibility_mode``) with
TransformerLens' defaults (BOS prepended), :meth:`enable_compatibility_mode` runs
HookedTransformer's weight processing with the bridge's flags (both, and what else the bridge
adds that its demos use, are :class:`mi_core.tl.bridge_compat.BridgeCompatMixin`'s, on
HookedTransformer too). Here, as on the bridge, a name filter skips the opt-in points whose
switch is off (with a warning) where HookedTransformer refuses them."""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Optional, Union

import torch

from mi_core import CapabilityError, HookError
from mi_core.tl.hook_points import HookPoint
from mi_core.tl.hooked_transformer import _OPT_IN, HookedTransformer

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
        ``hf_model=`` (a transformers model object, with ``tokenizer=``) is loaded from its
        weights. TransformerLens' options that cannot apply (a device map, config overrides,
        ...) raise a :class:`mi_core.CapabilityError` naming them."""
        hf_model = kwargs.pop("hf_model", None)  # written as a checkpoint (hf_objects)
        named = sorted(k for k, v in kwargs.items() if k not in _NEUTRAL or v != _NEUTRAL[k])
        if named:
            raise CapabilityError(
                f"TransformerBridge.boot_transformers: {', '.join(named)} not supported by "
                f"mi-core's TransformerLens layer (save other weights as a checkpoint "
                f"directory and pass its path)")
        kw: dict[str, Any] = {} if revision is None else {"revision": revision}
        if hf_model is not None:
            kw["hf_model"] = hf_model
        return cls.from_pretrained_no_processing(model_name, device=device, dtype=dtype,
                                                 tokenizer=tokenizer, **kw)

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


__all__ = ["TLBridgeHookError", "TransformerBridge"]
