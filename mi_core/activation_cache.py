"""Moved to :mod:`mi_core.tl.activation_cache` (the TransformerLens layer); kept as an alias."""

from mi_core.tl.activation_cache import *  # noqa: F401,F403
from mi_core.tl.activation_cache import (  # noqa: F401
    ActivationCache, Slice, accumulated_bias, get_act_name, head_results, layer_outputs,
    model_weight, norm_centres, stack_points,
)
