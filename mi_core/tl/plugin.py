"""The TransformerLens layer's plugin: its model conveniences on every MIModel (and
``apply_chat_template``), and the chat template files a hub download fetches."""

from __future__ import annotations

from typing import Any

from mi_core.plugin import plugin_impl


@plugin_impl
def mi_model_attributes() -> dict[str, Any]:
    from mi_core.tl.model import model_attributes
    from mi_core.tl.tokenizer import model_apply_chat_template

    return {**model_attributes(), "apply_chat_template": model_apply_chat_template}


@plugin_impl
def mi_hub_file_patterns() -> list[str]:
    from mi_core.tl.chat_template import HUB_PATTERNS

    return list(HUB_PATTERNS)  # chat templates, for apply_chat_template


@plugin_impl
def mi_plugin_info() -> dict[str, Any]:
    return {"provides": ["the TransformerLens layer (mi_core.tl)"]}
