"""Loading a TransformerBackend from a safetensors directory, a tensor dict, or a GGUF file;
quantized checkpoints (FP8, MXFP4) are dequantized as they load (:mod:`mi_transformer.quant`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from mi_core.plugin import (
    MITokenizer, ModelSource, SafetensorsCheckpoint, UnsupportedModelError, WeightLoadError,
    read_config,
)

from mi_transformer.config import parse_config
from mi_transformer.config.size import check_loaded
from mi_transformer.model import TransformerBackend
from mi_transformer.quant import dequantizing
from mi_transformer.weights import DictSource, TensorSource, check_tensors, load_weights


def from_tensors(config: Mapping[str, Any], tensors: TensorSource | Mapping[str, torch.Tensor],
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 tokenizer: MITokenizer | None = None, origin: str = "<memory>"
                 ) -> TransformerBackend:
    """A backend from an HF-style config dict and either a SafetensorsCheckpoint (or any
    TensorSource) or an in-memory ``{hf_name: tensor}`` dict. With a ``quantization_config``
    of FP8 or MXFP4 the tensors are dequantized to `dtype` as they load."""
    src: TensorSource = DictSource(tensors, origin) if isinstance(tensors, Mapping) else tensors
    src = dequantizing(src, config, origin)
    cfg = parse_config(config, f"{origin}/config.json", src.names())
    if cfg.model_type not in _known():
        chk = check_tensors(cfg, src.shapes)
        if not chk.ok:
            raise UnsupportedModelError(
                f"{origin}: model_type {cfg.model_type!r} is not a known family and its tensors "
                f"are not LLaMA-like; missing: {', '.join(chk.missing[:10]) or 'none'}; "
                f"unexpected: {', '.join(chk.unexpected[:10]) or 'none'}")
    device = torch.device(device)
    if not isinstance(tensors, Mapping):  # (tensors already in memory were paid for)
        check_loaded(cfg, f"{origin}/config.json", dtype, device)
    weights = load_weights(cfg, src, device, dtype)
    return TransformerBackend(cfg, weights, device, dtype, tokenizer)


def _known() -> set[str]:
    from mi_transformer.config import FAMILY_PARSERS

    return set(FAMILY_PARSERS)


def load_gguf(path: Path, device: torch.device, dtype: torch.dtype) -> TransformerBackend:
    try:
        from mi_transformer import gguf  # written alongside; needs the `gguf` extra
    except ImportError as exc:
        raise UnsupportedModelError(f"{path}: GGUF loading needs mi_transformer.gguf and the "
                                    f"'gguf' package (pip install 'mi-transformer[gguf]'): {exc}"
                                    ) from exc
    ck = gguf.read_gguf(path, dtype, device=device)
    return from_tensors(ck.config, ck.tensors, device, dtype, ck.tokenizer, origin=str(path))


def load_backend(source: ModelSource, device: torch.device, dtype: torch.dtype
                 ) -> TransformerBackend:
    """The BackendSpec loader: a directory with config.json + safetensors, or a .gguf file."""
    path = source.path
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return load_gguf(path, device, dtype)
        raise WeightLoadError(f"{path}: a single file must be .gguf; give the directory of a "
                              f"safetensors checkpoint instead")
    config = source.config if source.config is not None else read_config(path)
    if config is None:
        raise WeightLoadError(f"{path}: no config.json")
    return from_tensors(config, SafetensorsCheckpoint.from_directory(path), device, dtype,
                        origin=str(path))
