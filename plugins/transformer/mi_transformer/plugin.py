"""Registration of mi-transformer with mi-core (the same hooks a third-party plugin implements)."""

from __future__ import annotations

from typing import Any

from mi_core.plugin import BackendSpec, Detection, MIError, ModelSource
from mi_core import plugin_impl

from mi_transformer.config import FAMILIES, UnknownKeysError, parse_config
from mi_transformer.config.size import ConfigTooLarge
from mi_transformer.weights import check_tensors

BACKEND = "transformer"
#: the llama.cpp architectures mi_transformer.gguf reads (its GGUF_ARCHES; not imported here,
#: the gguf package is optional)
_GGUF = "llama, qwen2, qwen3, gemma, gemma2, phi3, starcoder2, olmo2, gpt2, qwen2moe, qwen3moe"


@plugin_impl
def mi_plugin_info() -> dict[str, Any]:
    return {"provides": [f"GGUF files ({_GGUF})"]}


@plugin_impl
def mi_register_backends() -> list[BackendSpec]:
    from mi_transformer.loader import load_backend

    return [BackendSpec(name=BACKEND, load=load_backend,
                        description="generic decoder-only transformer: "
                                    + ", ".join(FAMILIES) + ", LLaMA-like auto-config, GGUF")]


@plugin_impl
def mi_detect_backend(source: ModelSource) -> Detection:
    """Known model_type whose config parses strictly: 0.9; unknown type whose keys are all
    LLaMA's (or harmless) and whose tensors all match: 0.5; anything else: 0, naming the
    config keys that are not understood or the missing / unexpected tensors."""
    path = source.path
    if source.is_file:
        if path.suffix.lower() == ".gguf":
            return Detection(BACKEND, 0.9, f"GGUF file ({_GGUF})")
        return Detection(BACKEND, 0.0, f"{path.name}: single files must be .gguf")
    cfg = source.config
    if cfg is None:
        return Detection(BACKEND, 0.0, "no config.json")
    mt = cfg.get("model_type")
    known = isinstance(mt, str) and mt in FAMILIES
    try:
        ac = parse_config(cfg, str(path / "config.json"), source.tensor_names)
    except UnknownKeysError as exc:
        return Detection(BACKEND, 0.0, f"model_type {mt!r}: config keys not understood "
                                       f"(they may change the numbers): {', '.join(exc.keys)}",
                         config_keys=list(exc.keys))
    except ConfigTooLarge as exc:  # recognised, too large for this machine: loading says so
        return Detection(BACKEND, 0.1, f"model_type {mt!r}: {exc}")
    except MIError as exc:
        what = "a supported family but its config is invalid" if known else \
            "unknown and config not LLaMA-like"
        return Detection(BACKEND, 0.0, f"model_type {mt!r} {what}: {exc}")
    if known:
        return Detection(BACKEND, 0.9, f"model_type {mt!r} is a supported family")
    if not source.tensor_shapes:
        return Detection(BACKEND, 0.0, f"model_type {mt!r} unknown and no safetensors to inspect")
    chk = check_tensors(ac, source.tensor_shapes)
    if chk.ok:
        return Detection(BACKEND, 0.5, f"model_type {mt!r} unknown; every config key and tensor "
                                       f"is LLaMA's (auto-config: assumes LLaMA arithmetic)")
    why = "; ".join(chk.misshaped[:3]) if chk.misshaped else ""
    return Detection(BACKEND, 0.0, f"model_type {mt!r} unknown and its tensors do not match a "
                                   f"LLaMA-like layout" + (f" ({why})" if why else ""),
                     missing=chk.missing, unexpected=chk.unexpected)


@plugin_impl
def mi_default_model() -> str | None:
    """The embedded SmolLM2 GGUF, when mi_transformer.gguf can find it."""
    try:
        from mi_transformer import gguf

        path = gguf.default_model_path()
    except Exception:  # gguf module / package not available, or model not installed
        return None
    return str(path) if path is not None else None
