"""The TransformerLens layer: what a TransformerLens user expects, on any mi-core model.

- :class:`ActivationCache` (``model.run_with_cache``'s cache, TransformerLens' keys and
  methods), :func:`get_act_name`, :class:`Slice`;
- the model conveniences of :class:`TransformerLensMixin` (``run_with_cache``,
  ``run_with_hooks``, ``W_Q`` ..., ``process_weights``, ``to_single_token``, ``test_prompt``),
  registered on every :class:`mi_core.MIModel` by this ring's plugin (``mi_model_attributes``);
- :class:`FactoredMatrix`, and :mod:`mi_core.tl.patching` (TransformerLens' patching
  functions).

It builds on the kernel's public API only (see docs/ARCHITECTURE.md).
"""

from mi_core.tl import patching
from mi_core.tl.activation_cache import ActivationCache, Slice, get_act_name
from mi_core.tl.factored_matrix import FactoredMatrix
from mi_core.tl.model import TLConfig, TransformerLensMixin

__all__ = ["ActivationCache", "FactoredMatrix", "Slice", "TLConfig", "TransformerLensMixin",
           "get_act_name", "patching"]
