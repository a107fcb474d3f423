"""TransformerLens 3's module path ``transformer_lens.HookedRootModule`` (its Main Demo:
``from transformer_lens.HookedRootModule import HookedRootModule``): the same class as
:class:`mi_core.tl.hook_points.HookedRootModule`."""

from mi_core.tl.hook_points import HookedRootModule

__all__ = ["HookedRootModule"]
