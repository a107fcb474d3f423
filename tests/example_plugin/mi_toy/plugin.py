"""The toy plugin's hooks: a backend (registration and detection), as any backend plugin
implements them, and a model convenience (an analysis on every model)."""

from __future__ import annotations

from typing import Any

from mi_core.plugin import BackendSpec, Detection, ModelSource, plugin_impl
from mi_toy.analysis import resid_norms
from mi_toy.model import ToyBackend


@plugin_impl
def mi_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="toy", load=ToyBackend.load,
                        description="toy residual-MLP language model (example plugin)")]


@plugin_impl
def mi_detect_backend(source: ModelSource) -> Detection:
    model_type = (source.config or {}).get("model_type")
    if model_type != "toy-mlp":
        return Detection("toy", 0.0, f"model_type {model_type!r} is not 'toy-mlp'")
    missing = [n for n in ("embed", "unembed") if n not in source.tensor_names]
    if missing:
        return Detection("toy", 0.0, "toy-mlp config but tensors are missing", missing=missing,
                         implements=True)
    return Detection("toy", 1.0, "model_type 'toy-mlp' with embed/unembed tensors",
                     implements=True)


@plugin_impl
def mi_model_attributes() -> dict[str, Any]:
    """``model.resid_norms(prompt)`` on every model, whatever its backend."""
    return {"resid_norms": resid_norms}
