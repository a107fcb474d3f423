"""The pluggy hook specifications: the whole surface a plugin implements.

Every hook is optional. Built-in plugins implement exactly these, as a third party would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import argparse

    from mi_core.registry import BackendSpec, Detection, DictionaryFormat, ModelSource, TokenizerSpec

hookspec = pluggy.HookspecMarker("mi_core")
hookimpl = pluggy.HookimplMarker("mi_core")


@hookspec
def mi_register_backends() -> "list[BackendSpec]":
    """Return the backends this plugin provides (name, loader, description)."""


@hookspec
def mi_detect_backend(source: "ModelSource") -> "list[Detection] | Detection | None":
    """Given a checkpoint (parsed config.json and tensor names; no weights), say whether and
    how well each of your backends can load it (score in [0, 1], 0 = cannot) and why."""


@hookspec
def mi_register_dictionary_formats() -> "list[DictionaryFormat]":
    """Return the SAE / transcoder / CLT file formats this plugin can detect and load."""


@hookspec
def mi_register_tokenizers() -> "list[TokenizerSpec]":
    """Return tokenizer loaders (e.g. the RWKV World tokenizer) for model directories."""


@hookspec
def mi_hub_file_patterns() -> "list[str]":
    """Extra glob patterns a hub download must fetch for this plugin's models/dictionaries."""


@hookspec
def mi_register_commands(subparsers: "argparse._SubParsersAction") -> None:
    """Add CLI subcommands to ``mi``; set ``func=callable(args) -> int`` on each parser."""


@hookspec(firstresult=True)
def mi_default_model() -> "str | None":
    """Path of an embedded default model for ``mi demo`` (first plugin that has one wins)."""


@hookspec
def mi_plugin_info() -> "dict[str, Any]":
    """Free-form description for ``mi plugins`` (e.g. {"provides": [...]})."""
