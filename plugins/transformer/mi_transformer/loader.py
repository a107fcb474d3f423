"""Loading a TransformerBackend from a safetensors directory, a tensor dict, or a GGUF file;
quantized checkpoints (FP8, MXFP4) are dequantized as they load (:mod:`mi_transformer.quant`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import torch

from mi_core.plugin import (
    InputError, MITokenizer, ModelSource, Placement, SafetensorsCheckpoint, UnsupportedModelError,
    WeightLoadError, read_config,
)

from mi_transformer.config import parse_config
from mi_transformer.config.size import check_loaded
from mi_transformer.model import TransformerBackend
from mi_transformer.placement import Layout, canonical, layout
from mi_transformer.quant import dequantizing
from mi_transformer.quant_refusals import quantized_tensors_refusal, refuse_modelopt
from mi_transformer.weights import (DictSource, TensorSource, check_tensors, load_weights,
                                   tensor_table)


def from_tensors(config: Mapping[str, Any], tensors: TensorSource | Mapping[str, torch.Tensor],
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 tokenizer: MITokenizer | None = None, origin: str = "<memory>", *,
                 placement: Placement | None = None) -> TransformerBackend:
    """A backend from an HF-style config dict and either a SafetensorsCheckpoint (or any
    TensorSource) or an in-memory ``{hf_name: tensor}`` dict. With a ``quantization_config``
    of FP8 or MXFP4 the tensors are dequantized to `dtype` as they load. `placement`: the
    checked ``device_map`` / ``max_memory`` / ``offload`` of ``from_pretrained``."""
    src: TensorSource = DictSource(tensors, origin) if isinstance(tensors, Mapping) else tensors
    src = dequantizing(src, config, origin)
    cfg = parse_config(config, f"{origin}/config.json", src.names())
    why = quantized_tensors_refusal(src.shapes, lambda: check_tensors(cfg, src.shapes).unexpected,
                                    origin)
    if why:  # (before the generic list of unexpected tensors)
        raise UnsupportedModelError(why)
    if cfg.model_type not in _known():
        chk = check_tensors(cfg, src.shapes)
        if not chk.ok:
            raise UnsupportedModelError(
                f"{origin}: model_type {cfg.model_type!r} is not a known family and its tensors "
                f"are not LLaMA-like; missing: {', '.join(chk.missing[:10]) or 'none'}; "
                f"unexpected: {', '.join(chk.unexpected[:10]) or 'none'}")
    device = torch.device(device)
    if not isinstance(tensors, Mapping):  # (tensors already in memory were paid for)
        if placement is None:
            check_loaded(cfg, f"{origin}/config.json", dtype, device)
        elif placement.mode == "none" and placement.offload == "cpu":
            # every weight stays in CPU memory; "auto" / "sequential" are checked by the
            # placement engine, disk offload holds a few blocks
            check_loaded(cfg, f"{origin}/config.json", dtype, torch.device("cpu"))
    lay = Layout.single(canonical(device), cfg.num_layers) if placement is None else \
        layout(placement, *part_sizes(cfg, dtype))
    if lay.offload == "disk" and not isinstance(src, SafetensorsCheckpoint):
        raise InputError(f"{origin}: offload='disk' leaves the weights memory-mapped in "
                         f"safetensors files; this checkpoint's tensors are made in memory "
                         f"(GGUF, FP8/MXFP4 dequantized): use offload='cpu'")
    weights = load_weights(cfg, src, device, dtype, layout=lay)
    return TransformerBackend(cfg, weights, lay.embed, dtype, tokenizer, layout=lay)


def part_sizes(cfg: Any, dtype: torch.dtype) -> tuple[list[int], int, int]:
    """(bytes of each block, of the embedding, of the unembedding and final norm) as loaded
    in `dtype` (the placement engine's sizes; float32 routers counted as bf16/f16 would be
    a few bytes short, well inside accelerate-style 10% headroom)."""
    size = torch.empty((), dtype=dtype).element_size()
    blocks, embed, unembed = [0] * cfg.num_layers, 0, 0
    for e in tensor_table(cfg).values():
        n = size * math.prod(e.shape)
        if e.layer is not None:
            blocks[e.layer] += n
        elif e.slot in ("embed", "pos_embed"):
            embed += n
        else:
            unembed += n
    if cfg.tie_word_embeddings:
        unembed += size * cfg.vocab_size * cfg.hidden_size
    return blocks, embed, unembed


def _known() -> set[str]:
    from mi_transformer.config import FAMILY_PARSERS

    return set(FAMILY_PARSERS)


def load_gguf(path: Path, device: torch.device, dtype: torch.dtype, *,
              placement: Placement | None = None) -> TransformerBackend:
    try:
        from mi_transformer import gguf  # written alongside; needs the `gguf` extra
    except ImportError as exc:
        raise UnsupportedModelError(f"{path}: GGUF loading needs mi_transformer.gguf and the "
                                    f"'gguf' package (pip install 'mi-transformer[gguf]'): {exc}"
                                    ) from exc
    ck = gguf.read_gguf(path, dtype, device=device)
    return from_tensors(ck.config, ck.tensors, device, dtype, ck.tokenizer, origin=str(path),
                        placement=placement)


def load_backend(source: ModelSource, device: torch.device, dtype: torch.dtype, *,
                 placement: Placement | None = None) -> TransformerBackend:
    """The BackendSpec loader: a directory with config.json + safetensors, or a .gguf file;
    `placement` as :func:`from_tensors`."""
    path = source.path
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return load_gguf(path, device, dtype, placement=placement)
        raise WeightLoadError(f"{path}: a single file must be .gguf; give the directory of a "
                              f"safetensors checkpoint instead")
    config = source.config if source.config is not None else read_config(path)
    if config is None:
        raise WeightLoadError(f"{path}: no config.json")
    refuse_modelopt(path)  # (detection says so too; backend= skips detection)
    return from_tensors(config, SafetensorsCheckpoint.from_directory(path), device, dtype,
                        origin=str(path), placement=placement)
