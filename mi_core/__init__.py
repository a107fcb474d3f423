"""mi-core: mechanistic interpretability of language models on PyTorch.

Public names only (see docs/ and the API reference built by scripts/api_docs.py); backends
and formats are plugins.
"""

from mi_core.activation_cache import ActivationCache, Slice, get_act_name
from mi_core.backend import GenerationResult, MIBackend, MIModel, check_compatibility, sample_token
from mi_core.dictionaries import CltFeatureId, SparseActivations, SparseDictionary, load_dictionary
from mi_core.errors import (
    CapabilityError,
    ConfigError,
    DictionaryError,
    HookError,
    InputError,
    InterventionError,
    MIError,
    PluginError,
    TokenizerError,
    UnsupportedModelError,
    WeightLoadError,
)
from mi_core.hooks import HookCache, HookPoint, HookRun, HookSpec
from mi_core.hookspecs import hookimpl, hookspec, plugin_impl, plugin_spec
from mi_core.shapes import standard_shape
from mi_core.interventions import Add, Intervention, Knockout, Replace, Scale, Steer, Zero
from mi_core.interp import (
    AblationResult, DoseResponseCurve, DoseResponsePoint, FactoredMatrix, KnockoutSpec,
    LogitLensAnalysis, LogitLensResult, PatchingResult, RecurrentFeedbackEntry,
    RecurrentPassSpec, StateAblationResult, StateSteeringResult, SteeringCalibration,
    SteeringResult, SteeringSpec, TokenPrediction, apply_steering, create_knockout_mask,
    forward_recurrent, generate_recurrent, kl_divergence,
)
from mi_core.util.memory import MemoryReport, MemorySnapshot
from mi_core.util.pca import PcaResult, pca
from mi_core.util.positions import PositionConversion, convert_positions
from mi_core.scale import (
    ActivationStore, CacheReport, StoreError, SweepError, SweepRun, cache_activations,
    load_sweep, run_sweep,
)
from mi_core.registry import (
    BackendSpec,
    CompatibilityReport,
    Detection,
    DictionaryFormat,
    ModelSource,
    TokenizerSpec,
)
from mi_core.serialize import from_json, to_json
from mi_core.state import StateKnockoutSpec, StateSteeringSpec
from mi_core.tokenizer import EncodingWithOffsets, HFTokenizer, MITokenizer
from mi_core import viz  # interactive HTML views: mi.viz.attention_html(...), ...

__version__ = "0.1.0"

__all__ = [
    "ActivationCache", "Slice", "get_act_name",
    "Add", "BackendSpec", "CapabilityError", "InputError", "hookimpl", "hookspec",
    "plugin_impl", "plugin_spec", "standard_shape", "CltFeatureId", "CompatibilityReport", "ConfigError", "Detection",
    "DictionaryError", "DictionaryFormat", "EncodingWithOffsets", "GenerationResult",
    "HFTokenizer", "HookCache", "HookError", "HookPoint", "HookRun", "HookSpec", "Intervention",
    "InterventionError", "Knockout", "MIBackend", "MIError", "MIModel", "MITokenizer",
    "ModelSource", "PluginError", "Replace", "Scale", "SparseActivations", "SparseDictionary",
    "StateKnockoutSpec", "StateSteeringSpec", "Steer", "TokenizerError", "TokenizerSpec",
    "UnsupportedModelError", "WeightLoadError", "Zero", "check_compatibility", "from_json",
    "load_dictionary", "sample_token", "to_json",
    # analysis layer (mi_core.interp, mi_core.util)
    "AblationResult", "DoseResponseCurve", "DoseResponsePoint", "FactoredMatrix",
    "KnockoutSpec", "LogitLensAnalysis", "LogitLensResult", "PatchingResult",
    "RecurrentFeedbackEntry", "RecurrentPassSpec", "StateAblationResult",
    "StateSteeringResult", "SteeringCalibration", "SteeringResult",
    "SteeringSpec", "TokenPrediction", "apply_steering", "create_knockout_mask",
    "forward_recurrent", "generate_recurrent", "kl_divergence", "MemoryReport",
    "MemorySnapshot", "PcaResult", "pca", "PositionConversion", "convert_positions",
    # experiments at scale (mi_core.scale)
    "ActivationStore", "CacheReport", "StoreError", "SweepError", "SweepRun",
    "cache_activations", "load_sweep", "run_sweep",
]
