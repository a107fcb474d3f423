"""The TransformerLens layer's plugin: its model conveniences on every MIModel."""

from __future__ import annotations

from typing import Any

from mi_core.plugin import plugin_impl


@plugin_impl
def mi_model_attributes() -> dict[str, Any]:
    from mi_core.tl.model import model_attributes

    return model_attributes()


@plugin_impl
def mi_plugin_info() -> dict[str, Any]:
    return {"provides": ["the TransformerLens layer (mi_core.tl)"]}
