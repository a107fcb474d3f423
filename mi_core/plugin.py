"""The plugin SDK: everything a backend, dictionary, analysis or view plugin needs from the
kernel, in one module. Plugins (the built-in ones included) import from here or from
``mi_core`` itself, never from the kernel's other modules, so those can change freely.

A backend implements :class:`MIBackend` (plus the capabilities it declares), calls
``run.apply(name, x)`` at each hook point of its forward (``run = hooks.start()``), and
registers through ``@plugin_impl def mi_register_backends()`` and ``mi_detect_backend``.
A dictionary format registers a :class:`DictionaryFormat`; a sequence mixer a :class:`MixerSpec`
(found by a backend's generic block through :func:`mixer`); a view a :class:`ViewSpec`; a model
convenience a function or property through ``mi_model_attributes``. Commands for the ``mi``
CLI register with :mod:`mi_cli.plugin` (torch-free, so ``mi --help`` answers at once).
See docs/PLUGINS.md.
"""

from mi_core.backend import MIModel, require_points
from mi_core.capabilities import (
    ContextLength, Gradients, HookShapes, KVCachedGeneration, LayerSchedule, LayerTypes, Readout,
    StateInterventions, WeightAccess, WeightProcessing)
from mi_core.capabilities import capabilities as capabilities_of
from mi_core.capabilities import has as has_capability
from mi_core.capabilities import require as require_capability
from mi_core.capabilities import HeadTerms, ResidualTerms, require_head_sum, require_residual_sum
from mi_core.configread import (
    GENERIC_AT_DEFAULT, GENERIC_HARMLESS, REQUIRED, ConfigFields, is_generic_harmless)
from mi_core.dictionaries import CltFeatureId, SparseActivations, SparseDictionary, load_dictionary
from mi_core.errors import (
    CapabilityError, ConfigError, DictionaryError, HookError, InputError, InterventionError,
    MetricError, MIError, PluginError, TokenizerError, UnsupportedModelError, WeightLoadError)
from mi_core.generation import GenerationResult, sample_token
from mi_core.hooks import HookCache, HookRun, HookSpec
from mi_core.hookspecs import hookimpl, plugin_impl
from mi_core.inputs import check_dtype, resolve_device
from mi_core.interventions import (
    Add, Intervention, Knockout, Replace, Scale, Steer, Zero, check_broadcast)
from mi_core.loading import (
    DEFAULT_HUB_PATTERNS, MEMORY_CHECK_ENV, PICKLE_SUFFIXES, SafetensorsCheckpoint,
    available_memory, check_memory, checked_tensor, looks_like_hub_id, read_config, read_json,
    refuse_pickle, require_field, resolve_source, safetensors_header)
from mi_core.placement import Placement, check_placement
from mi_core.plugins import (
    dictionary_formats, get_plugin_manager, mixer, mixers, plugin_infos, register_plugin,
    unregister_plugin, view)
from mi_core.points import (
    GLOBAL_NAMES, LAYER_SUFFIXES, OPT_IN_SUFFIXES, PRE_SOFTMAX_SCORES, HookLike, HookPoint,
    hook_name)
from mi_core.progress import Progress, progress, set_progress
from mi_core.protocol import MIBackend
from mi_core.registry import (
    BackendSpec, CompatibilityReport, Detection, DictionaryFormat, MixerSpec, ModelSource,
    TokenizerSpec, ViewSpec)
from mi_core.serialize import converter, from_json, to_json
from mi_core.shapes import standard_shape
from mi_core.state import StateKnockoutSpec, StateSteeringSpec
from mi_core.tokenizer import EncodingWithOffsets, HFTokenizer, MITokenizer

__all__ = [
    "Add", "BackendSpec", "CapabilityError", "CltFeatureId", "CompatibilityReport", "ContextLength",
    "ConfigError", "ConfigFields", "DEFAULT_HUB_PATTERNS", "Detection", "DictionaryError",
    "DictionaryFormat", "EncodingWithOffsets", "GENERIC_AT_DEFAULT", "GENERIC_HARMLESS",
    "GLOBAL_NAMES", "GenerationResult", "Gradients", "HFTokenizer", "HookCache", "HookError",
    "HookLike", "HookPoint", "HookRun", "HookShapes", "HookSpec", "InputError", "Intervention",
    "InterventionError", "KVCachedGeneration", "Knockout", "LAYER_SUFFIXES", "LayerSchedule",
    "LayerTypes", "MEMORY_CHECK_ENV", "available_memory", "check_memory",
    "MIBackend", "MIError", "MIModel", "MITokenizer", "MetricError", "MixerSpec", "ModelSource",
    "OPT_IN_SUFFIXES", "PICKLE_SUFFIXES", "PRE_SOFTMAX_SCORES", "Placement", "PluginError",
    "Progress",
    "REQUIRED", "Readout", "Replace", "SafetensorsCheckpoint", "Scale", "SparseActivations",
    "SparseDictionary", "StateInterventions", "StateKnockoutSpec", "StateSteeringSpec", "Steer",
    "TokenizerError", "TokenizerSpec", "UnsupportedModelError", "ViewSpec", "WeightAccess",
    "WeightLoadError", "WeightProcessing", "Zero", "capabilities_of", "check_broadcast",
    "check_placement",
    "check_dtype", "checked_tensor", "converter", "dictionary_formats", "from_json",
    "get_plugin_manager",
    "has_capability", "hook_name", "hookimpl", "is_generic_harmless", "load_dictionary",
    "looks_like_hub_id", "mixer", "mixers", "plugin_impl", "plugin_infos", "progress",
    "read_config", "read_json", "refuse_pickle", "register_plugin", "require_capability",
    "ResidualTerms", "require_residual_sum", "HeadTerms", "require_head_sum",
    "require_field", "require_points", "resolve_device", "resolve_source", "safetensors_header", "sample_token",
    "set_progress", "standard_shape", "to_json", "unregister_plugin", "view",
]
