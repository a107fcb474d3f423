"""The mi-core error hierarchy. Every error names its culprit (file, tensor, hook point, shape)."""

from __future__ import annotations


class MIError(Exception):
    """Base class of every error mi-core and its plugins raise on purpose."""


class ConfigError(MIError):
    """A config file is missing, malformed, or lacks a required field."""


class UnsupportedModelError(MIError):
    """No installed plugin can load this checkpoint; the message lists every plugin's reason."""


class WeightLoadError(MIError):
    """A checkpoint file is unreadable or holds missing / mis-shaped tensors."""


class HookError(MIError):
    """A hook point is unknown to the model, out of range, or was not captured."""


class InterventionError(MIError):
    """An intervention cannot be applied (shape that cannot broadcast, bad argument)."""


class TokenizerError(MIError):
    """A tokenizer file is missing or malformed, or ids are out of the vocabulary."""


class DictionaryError(MIError):
    """An SAE / transcoder / CLT file is missing, malformed or incompatible."""


class PluginError(MIError):
    """A plugin failed to load or registered something invalid."""


class CapabilityError(MIError):
    """The backend lacks a capability the call needs (state interventions, a layer schedule,
    weight access, a KV cache, ...); raised before any compute, never a silent no-op."""


class InputError(MIError):
    """A call argument is invalid (token ids, attention mask, generation settings, device);
    the message names the argument."""


class MetricError(MIError):
    """A metric cannot be normalised (clean and corrupted values are equal) or is not a scalar."""
