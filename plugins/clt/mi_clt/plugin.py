"""Registration of mi-clt with mi-core (the same hooks a third-party plugin implements)."""

from __future__ import annotations

from typing import Any

from mi_core.hookspecs import hookimpl


@hookimpl
def mi_plugin_info() -> dict[str, Any]:
    return {"provides": []}
