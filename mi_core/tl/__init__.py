"""The TransformerLens layer: what a TransformerLens user expects, on any mi-core model.

``from mi_core.tl import HookedTransformer, HookedRootModule, HookPoint, FactoredMatrix,
ActivationCache, utils`` (and ``patching``, ``head_detector``, ``hook_points``,
``utilities``) gives TransformerLens' names with TransformerLens' behaviour (docs/
TRANSFORMERLENS.md lists what still differs):

- :class:`HookedTransformer` (``from_pretrained`` with TransformerLens' defaults, BOS
  prepended, ``model(x)`` returning logits, the module tree, persistent hooks, ``generate``),
  built on the kernel's :class:`mi_core.MIModel` (``model.mi_model``);
- :class:`HookedRootModule` and :class:`HookPoint` (TransformerLens' hooking modules; not
  the kernel's :class:`mi_core.HookPoint`, which names a point);
- :class:`ActivationCache` (``run_with_cache``'s cache, TransformerLens' keys and methods),
  :func:`get_act_name`, :class:`Slice`, :class:`FactoredMatrix`, :class:`HookedTransformerConfig`;
- :mod:`~mi_core.tl.utils` (also as ``utilities``), :mod:`~mi_core.tl.patching`,
  :mod:`~mi_core.tl.head_detector`, :mod:`~mi_core.tl.evals`,
  :mod:`~mi_core.tl.past_key_value_caching` (``model(tokens, past_kv_cache=cache)``);
- :mod:`~mi_core.tl.model_bridge`'s ``TransformerBridge`` (TransformerLens 3's loading:
  ``boot_transformers`` then ``enable_compatibility_mode``), a HookedTransformer;
- the conveniences of :class:`TransformerLensMixin` (``run_with_cache``, ``run_with_hooks``,
  ``W_Q`` ..., ``process_weights``, ``to_single_token``, ``test_prompt``) registered on every
  :class:`mi_core.MIModel` by this ring's plugin (``mi_model_attributes``), with MIModel's own
  defaults (no BOS added beyond the tokenizer's, ``model(x)`` a HookCache).

It builds on the kernel's public API only (see docs/ARCHITECTURE.md).
"""

from mi_core.tl import evals, head_detector, hook_points, patching, utilities, utils
from mi_core.tl import past_key_value_caching
from mi_core.tl import HookedRootModule as _module_path  # noqa: F401  (the class rebinds it)

from mi_core.tl.activation_cache import ActivationCache, Slice, get_act_name
from mi_core.tl.config import HookedTransformerConfig
from mi_core.tl.factored_matrix import FactoredMatrix
from mi_core.tl.hook_points import HookedRootModule, HookPoint
from mi_core.tl.hooked_transformer import HookedTransformer, Output
from mi_core.tl.model import TLConfig, TransformerLensMixin
from mi_core.tl.past_key_value_caching import TransformerLensKeyValueCache
from mi_core.tl import model_bridge  # noqa: E402  (TransformerLens 3's TransformerBridge)

__all__ = ["ActivationCache", "FactoredMatrix", "HookPoint", "HookedRootModule",
           "HookedTransformer", "HookedTransformerConfig", "Output", "Slice", "TLConfig",
           "TransformerLensMixin", "evals", "get_act_name", "head_detector", "hook_points",
           "model_bridge", "past_key_value_caching", "patching", "TransformerLensKeyValueCache",
           "utilities", "utils"]
