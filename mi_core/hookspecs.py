"""The plugin surface: the pluggy specifications a plugin implements.

Every function is optional. Built-in plugins and rings implement exactly these, as a third
party would, marking each with ``@plugin_impl`` (``hookimpl`` is kept as an alias; the names
say "plugin" so they do not read like :class:`mi_core.HookSpec`, which is about model hooks).
CLI commands register with the ``mi`` command's own, torch-free surface (``mi_cli.plugin``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pluggy

from mi_core.registry import (
    BackendSpec, Detection, DictionaryFormat, MixerSpec, ModelSource, TokenizerSpec, ViewSpec,
)

#: Marks a specification of the plugin surface (used in this module only).
plugin_spec = pluggy.HookspecMarker("mi_core")
#: Marks a plugin's implementation: ``@mi_core.plugin_impl def mi_register_backends(): ...``
plugin_impl = pluggy.HookimplMarker("mi_core")
#: Aliases kept for plugin authors (pluggy's own names).
hookspec = plugin_spec
hookimpl = plugin_impl


@plugin_spec
def mi_register_backends() -> list[BackendSpec]:
    """Return the backends this plugin provides (name, loader, description)."""


@plugin_spec
def mi_detect_backend(source: ModelSource) -> list[Detection] | Detection | None:
    """Given a checkpoint (parsed config.json and tensor names; no weights), say whether and
    how well each of your backends can load it (score in [0, 1], 0 = cannot) and why."""


@plugin_spec
def mi_register_dictionary_formats() -> list[DictionaryFormat]:
    """Return the SAE / transcoder / CLT file formats this plugin can detect and load."""


@plugin_spec
def mi_register_mixers() -> list[MixerSpec]:
    """Return the sequence mixers this plugin provides to generic blocks, by layer type name
    (a backend finds them through ``mi_core.plugin.mixer(name)``, never by importing you)."""


@plugin_spec
def mi_register_tokenizers() -> list[TokenizerSpec]:
    """Return tokenizer loaders for model directories (e.g. a model-specific vocabulary file)."""


@plugin_spec
def mi_declare_hook_points() -> dict[str, str]:
    """Per-layer hook points your backends add beyond the standard ones, as
    {factory name: suffix}, e.g. ``{"mixer_state": "mixer.hook_state"}``: the suffix becomes a
    known point (``blocks.{i}.mixer.hook_state``) and ``HookPoint.mixer_state(i)`` a factory.
    Shapes come from the backend's ``hook_shape`` (the HookShapes capability)."""


@plugin_spec
def mi_opt_in_hook_points() -> list[str]:
    """Suffixes of your per-layer points that are large or costly (per-step states, seq x seq
    matrices): computed only when hooked, and left out of a default ``run_with_cache``."""


@plugin_spec
def mi_hub_file_patterns() -> list[str]:
    """Extra glob patterns a hub download must fetch for this plugin's models/dictionaries."""


@plugin_spec
def mi_model_attributes() -> dict[str, Any]:
    """Conveniences on every :class:`mi_core.MIModel`, as {name: function or property}: a
    function becomes a method (``model.name(...)``, the model passed first), a ``property`` an
    attribute. A name the model already has, or one two plugins both claim, is a PluginError."""


@plugin_spec
def mi_register_views() -> list[ViewSpec]:
    """Return the views (pictures, interactive pages) this plugin draws, by name; results call
    them through ``mi_core.plugins.view(name)``."""


@plugin_spec
def mi_register_commands(subparsers: Any) -> None:
    """Deprecated: register commands with the command line's own surface (the ``mi_cli``
    entry-point group, :mod:`mi_cli.plugin`), which builds its parser without torch. A
    command registered here still works, found when ``mi`` is given a command it does not
    know (it is not listed by ``mi --help``)."""


@plugin_spec(firstresult=True)
def mi_default_model() -> str | None:
    """Path of an embedded default model for ``mi demo`` (first plugin that has one wins)."""


@plugin_spec(firstresult=True)
def mi_checkpoint_from_config(config: Any, directory: Path, norm_gain: float) -> bool | None:
    """Write into `directory` a checkpoint (config.json, model.safetensors) that expresses
    `config`, another library's model config (``mi_core.tl``'s ``HookedTransformerConfig``):
    norm gains `norm_gain`, every other tensor 0. True when written; None when `config` is
    not yours; a CapabilityError naming the fields your format cannot hold."""


@plugin_spec
def mi_plugin_info() -> dict[str, Any]:
    """Free-form description for ``mi plugins`` (e.g. {"provides": [...]})."""
