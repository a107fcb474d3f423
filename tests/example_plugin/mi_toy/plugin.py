"""The toy plugin's hooks: the same three any backend plugin implements."""

from __future__ import annotations

from mi_core import BackendSpec, Detection, ModelSource
from mi_core import plugin_impl
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
        return Detection("toy", 0.0, "toy-mlp config but tensors are missing", missing=missing)
    return Detection("toy", 1.0, "model_type 'toy-mlp' with embed/unembed tensors")
