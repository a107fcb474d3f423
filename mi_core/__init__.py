"""mi-core: mechanistic interpretability of language models on PyTorch.

``import mi_core`` loads the kernel only: the backend protocol and capabilities, hook points,
specs and caches, the interventions, the plugin manager and its hookspecs, detection,
loading, the tokenizer protocol, the strict config reader, the errors and `MIModel`. The
rings (analyses ``mi_core.interp``, views ``mi_core.viz``, the TransformerLens layer
``mi_core.tl``, experiments at scale ``mi_core.scale``) load on first use: their public names
below resolve lazily, so ``mi.KnockoutSpec`` or ``mi.run_sweep`` work as before. Plugin authors
import :mod:`mi_core.plugin`. See docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from mi_core.backend import GenerationResult, MIBackend, MIModel, check_compatibility, sample_token
from mi_core.dictionaries import CltFeatureId, SparseActivations, SparseDictionary, load_dictionary
from mi_core.errors import (
    CapabilityError, ConfigError, DictionaryError, HookError, InputError, InterventionError,
    MIError, PluginError, TokenizerError, UnsupportedModelError, WeightLoadError,
)
from mi_core.hooks import HookCache, HookRun, HookSpec
from mi_core.hookspecs import hookimpl, hookspec, plugin_impl, plugin_spec
from mi_core.interventions import Add, Intervention, Knockout, Replace, Scale, Steer, Zero
from mi_core.points import HookPoint
from mi_core.registry import (
    BackendSpec, CompatibilityReport, Detection, DictionaryFormat, ModelSource, TokenizerSpec,
    ViewSpec,
)
from mi_core.serialize import from_json, to_json
from mi_core.shapes import standard_shape
from mi_core.state import StateKnockoutSpec, StateSteeringSpec
from mi_core.tokenizer import EncodingWithOffsets, HFTokenizer, MITokenizer
from mi_core import configread, plugin  # noqa: E402,F401  (the config reader, the plugin SDK)

__version__ = "0.1.0"

#: Public names of the rings, resolved on first access (the kernel never imports a ring).
_RING_NAMES = {
    "mi_core.tl": ("ActivationCache", "FactoredMatrix", "Slice", "get_act_name"),
    "mi_core.interp": (
        "AblationResult", "DoseResponseCurve", "DoseResponsePoint", "KnockoutSpec",
        "LogitLensAnalysis", "LogitLensResult", "PatchingResult", "RecurrentFeedbackEntry",
        "RecurrentPassSpec", "StateAblationResult", "StateSteeringResult",
        "SteeringCalibration", "SteeringResult", "SteeringSpec", "TokenPrediction",
        "apply_steering", "create_knockout_mask", "forward_recurrent", "generate_recurrent",
        "kl_divergence"),
    "mi_core.util.memory": ("MemoryReport", "MemorySnapshot"),
    "mi_core.util.pca": ("PcaResult", "pca"),
    "mi_core.util.positions": ("PositionConversion", "convert_positions"),
    "mi_core.scale": ("ActivationStore", "CacheReport", "StoreError", "SweepError", "SweepRun",
                      "cache_activations", "load_sweep", "run_sweep"),
}
_LAZY = {name: module for module, names in _RING_NAMES.items() for name in names}
_RINGS = ("interp", "scale", "tl", "util", "viz")  # subpackages: mi.viz.attention_html(...)


def __getattr__(name: str) -> Any:
    """A ring's public name (or the ring itself), imported on first access."""
    if name in _RINGS:
        value = importlib.import_module(f"mi_core.{name}")
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'mi_core' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_RINGS))


__all__ = [
    "Add", "BackendSpec", "CapabilityError", "CltFeatureId", "CompatibilityReport",
    "ConfigError", "Detection", "DictionaryError", "DictionaryFormat", "EncodingWithOffsets",
    "GenerationResult", "HFTokenizer", "HookCache", "HookError", "HookPoint", "HookRun",
    "HookSpec", "InputError", "Intervention", "InterventionError", "Knockout", "MIBackend",
    "MIError", "MIModel", "MITokenizer", "ModelSource", "PluginError", "Replace", "Scale",
    "SparseActivations", "SparseDictionary", "StateKnockoutSpec", "StateSteeringSpec", "Steer",
    "TokenizerError", "TokenizerSpec", "UnsupportedModelError", "ViewSpec", "WeightLoadError",
    "Zero", "check_compatibility", "from_json", "hookimpl", "hookspec", "load_dictionary",
    "plugin_impl", "plugin_spec", "sample_token", "standard_shape", "to_json",
    *sorted(_LAZY),
]
