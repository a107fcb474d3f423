"""Registration of mi-probing with mi-core (the same hooks a third-party plugin implements)."""

from __future__ import annotations

from typing import Any

from mi_core import plugin_impl


@plugin_impl
def mi_plugin_info() -> dict[str, Any]:
    return {"provides": ["linear probes (mi probe)"]}
