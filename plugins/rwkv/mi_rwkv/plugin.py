"""Registration of mi-rwkv with mi-core (the same hooks a third-party plugin implements)."""

from __future__ import annotations

from mi_core.plugin import (
    BackendSpec, ConfigError, Detection, MIError, ModelSource, TokenizerSpec,
    UnsupportedModelError,
)
from mi_core import plugin_impl

from mi_rwkv.config import parse_v6, parse_v7, rwkv_version
from mi_rwkv.loading import load_rwkv6, load_rwkv7
from mi_rwkv.tokenizer import VOCAB_FILE, detect_world_vocab, load_world_vocab

#: Tensors whose presence identifies each format (checked at detection, no weights read).
_MARKERS = {
    6: ("rwkv.embeddings.weight", "rwkv.blocks.0.attention.time_maa_x",
        "rwkv.blocks.0.attention.time_faaaa", "rwkv.ln_out.weight"),
    7: ("model.embeddings.weight", "model.layers.0.attn.k_k", "model.layers.0.attn.r_k",
        "model.norm.weight"),
}


@plugin_impl
def mi_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec("rwkv6", load_rwkv6, "RWKV-6 (Finch), HF format (rwkv.blocks.*) or GGUF"),
        BackendSpec("rwkv7", load_rwkv7, "RWKV-7 (Goose), flash-linear-attention format "
                                         "(model.layers.*) or GGUF"),
    ]


def _detect_gguf(source: ModelSource) -> list[Detection]:
    """llama.cpp's ``rwkv6`` / ``rwkv7`` GGUF files, by ``general.architecture`` (the first
    key/values only); other GGUF architectures are not RWKV's to claim."""
    try:
        from mi_core.gguf import gguf_architecture

        arch = gguf_architecture(source.path)
    except ImportError as exc:  # the ring needs numpy
        return [Detection("rwkv6", 0.0, f"reading GGUF needs numpy and gguf "
                                        f"(pip install 'mi-rwkv[gguf]'): {exc}")]
    except MIError as exc:
        return [Detection("rwkv6", 0.0, f"{exc}")]
    if arch not in ("rwkv6", "rwkv7"):
        return []
    return [Detection(arch, 1.0, f"RWKV-{arch[-1]} GGUF file (general.architecture {arch!r})",
                      implements=True)]


@plugin_impl
def mi_detect_backend(source: ModelSource) -> list[Detection]:
    if source.path.is_file():
        return _detect_gguf(source) if source.path.suffix.lower() == ".gguf" else []
    try:
        version = rwkv_version(source.config, source.tensor_names)
    except UnsupportedModelError as exc:
        return [Detection("rwkv6", 0.0, str(exc))]
    if version is None:
        return []
    name = f"rwkv{version}"
    names = set(source.tensor_names)
    missing = [m for m in _MARKERS[version] if m not in names]
    if not names:
        return [Detection(name, 0.0, f"model_type {name!r} but no safetensors tensors found",
                          implements=True)]
    if missing:
        return [Detection(name, 0.0, f"RWKV-{version} config but the tensor names do not match "
                                     "the expected format", missing=missing, implements=True)]
    try:
        (parse_v6 if version == 6 else parse_v7)(source.config or {}, source.tensor_shapes)
    except ConfigError as exc:
        # Recognised as RWKV (model_type and tensor names), so loading it raises this
        # ConfigError (naming key, value and file) rather than "no plugin can load".
        return [Detection(name, 0.1, f"RWKV-{version} checkpoint with an invalid config: {exc}",
                          implements=True)]
    return [Detection(name, 1.0, f"RWKV-{version} checkpoint (model_type and tensor names)",
                      implements=True)]


@plugin_impl
def mi_declare_hook_points() -> dict[str, str]:
    """RWKV's own per-layer points; ``HookPoint.rwkv_state(i)`` etc. once plugins load."""
    return {"rwkv_state": "rwkv.hook_state", "rwkv_decay": "rwkv.hook_decay",
            "rwkv_effective_attn": "rwkv.hook_effective_attn"}


@plugin_impl
def mi_opt_in_hook_points() -> list[str]:
    """The state and the effective attention ([b, heads, s, s], O(s^2) to compute) are, as
    every recurrent mixer's (mi-ssm's), left out of a default run_with_cache: hook them by
    name or with a names_filter that accepts them."""
    return ["rwkv.hook_state", "rwkv.hook_effective_attn"]


@plugin_impl
def mi_register_tokenizers() -> list[TokenizerSpec]:
    return [TokenizerSpec("rwkv-world", detect_world_vocab, load_world_vocab)]


@plugin_impl
def mi_hub_file_patterns() -> list[str]:
    return [VOCAB_FILE]


