"""Quantized checkpoints as published, dequantized at load: MXFP4 experts
(``quantization_config.quant_method: "mxfp4"``, the only published form of gpt-oss).

A stacked expert tensor ``X`` is stored as ``X_blocks`` [E, rows, groups, 16] uint8 (two
e2m1 (FP4) values a byte, the low nibble first) and ``X_scales`` [E, rows, groups] uint8 (an
e8m0 exponent per group of 32 values: 2 ** (s - 127)) (:func:`dequantize_mxfp4`).
transformers holds the dequantized tensor transposed, [E, groups * 32, rows];
:class:`DequantizedSource` gives it under the name ``X`` in that layout, as a BF16 checkpoint
of the model holds it, so the families' weight tables never see the quantization.
Dequantization is exact in F32 (an FP4 value times a power of two); the result is cast to the
requested dtype and checked like any other weight (a value beyond F32, e.g. a scale byte of
255, is a WeightLoadError). Any other ``quant_method`` is refused by name.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
import torch

from mi_core.plugin import ConfigError, WeightLoadError, checked_tensor

#: The methods read here; any other ``quant_method`` is refused naming it.
SUPPORTED_METHODS = ("mxfp4",)
#: Keys of each method's quantization_config known not to change the dequantized numbers
#: (which modules stayed unquantized is read off the tensors; ``dequantize`` is
#: transformers' switch for what is always done here).
_HARMLESS = {"mxfp4": {"modules_to_not_convert", "dequantize"}}
#: e2m1 (FP4) code -> value; bit 3 is the sign (OCP microscaling spec, as transformers).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@attrs.frozen
class QuantConfig:
    """A validated ``quantization_config``."""

    method: str


def read_quant_config(cfg: Mapping[str, Any], src: str) -> QuantConfig | None:
    """The checked ``quantization_config`` of a config dict (None when absent or null); a
    method not supported or an unknown key inside it is a ConfigError naming it."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return None
    where = f"{src}: quantization_config"
    if not isinstance(qc, Mapping):
        raise ConfigError(f"{where} = {qc!r}: expected a JSON object")
    method = qc.get("quant_method")
    if not isinstance(method, str):
        raise ConfigError(f"{where}.quant_method = {method!r}: expected a string")
    if method not in SUPPORTED_METHODS:
        raise ConfigError(f"{where}.quant_method = {method!r} is not supported: mi-transformer "
                          f"reads {', '.join(map(repr, SUPPORTED_METHODS))} checkpoints "
                          f"(dequantized at load); load an unquantized copy of this model")
    unknown = sorted(k for k, v in qc.items()
                     if v is not None and k not in {"quant_method"} | _HARMLESS[method])
    if unknown:
        raise ConfigError(f"{where} has keys this backend does not read (they may change the "
                          f"numbers): {', '.join(unknown)}")
    return QuantConfig(method)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 -> F32: ``blocks`` [..., groups, 16] uint8 (two e2m1 codes a byte, the low
    nibble first), ``scales`` [..., groups] uint8 (e8m0: 2 ** (s - 127) per group of 32).
    Returns F32 [..., groups * 32] (the last dimension unpacked, in storage order); a shape
    mismatch is a ValueError naming both shapes."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and "
                         f"{scales.dtype}")
    if blocks.dim() < 2 or blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != tuple(
            scales.shape):
        raise ValueError(f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} "
                         f"do not match ([..., groups, 16] and [..., groups])")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.arange(256, device=blocks.device)
    pairs = torch.stack([lut[codes & 0x0F], lut[codes >> 4]], dim=-1)  # byte -> (low, high)
    out = pairs[blocks.int()].flatten(-2)  # [..., groups, 32]: the low nibble first
    out.mul_(torch.exp2(scales.float() - 127).unsqueeze(-1))  # exact: a power of two
    return out.flatten(-2)


def _raw(src: Any, name: str) -> torch.Tensor:
    """A tensor as stored (no dtype check): integer blocks are data here."""
    tensors = getattr(src, "tensors", None)
    if isinstance(tensors, Mapping):  # an in-memory source
        return tensors[name]
    return src.get(name, check=False)


class DequantizedSource:
    """A TensorSource (``names`` / ``shapes`` / ``get``) over an MXFP4 checkpoint: the
    tensors as transformers' dequantized model holds them (``X_blocks`` + ``X_scales`` become
    ``X`` [E, groups * 32, rows]). A blocks tensor without its scales (or the reverse), or
    shapes that do not pair, is a WeightLoadError naming them."""

    def __init__(self, src: Any, qc: QuantConfig, origin: str) -> None:
        self.src, self.qc, self.origin = src, qc, origin
        self.files = getattr(src, "files", None)
        raw: Mapping[str, tuple[int, ...]] = src.shapes
        self.plans: dict[str, tuple[str, str]] = {}
        for name in raw:
            for suffix, other in (("_blocks", "_scales"), ("_scales", "_blocks")):
                if name.endswith(suffix) and name[: -len(suffix)] + other not in raw:
                    raise WeightLoadError(f"{origin}: MXFP4 tensor {name!r} has no "
                                          f"{name[: -len(suffix)] + other!r} beside it")
            if not name.endswith("_blocks"):
                continue
            base = name[: -len("_blocks")]
            blocks, scales = raw[name], raw[base + "_scales"]
            if len(blocks) != 4 or blocks[-1] != 16 or tuple(blocks[:-1]) != tuple(scales):
                raise WeightLoadError(f"{origin}: MXFP4 tensors {name!r} {list(blocks)} and "
                                      f"{base + '_scales'!r} {list(scales)} are not "
                                      f"[experts, rows, groups, 16] and [experts, rows, groups]")
            self.plans[base] = (name, base + "_scales")
        used = {p for parts in self.plans.values() for p in parts}
        self.shapes: dict[str, tuple[int, ...]] = {
            n: tuple(s) for n, s in raw.items() if n not in used}
        for base, (blocks_name, _) in self.plans.items():
            e, rows, groups, nbytes = raw[blocks_name]
            self.shapes[base] = (e, groups * nbytes * 2, rows)  # transformers' layout

    def names(self) -> list[str]:
        return list(self.shapes)

    def get(self, name: str, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None,
            shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if name not in self.shapes:
            raise WeightLoadError(f"{self.origin}: tensor {name!r} not found")
        if shape is not None and tuple(self.shapes[name]) != tuple(shape):
            raise WeightLoadError(f"{self.origin}: tensor {name!r} has shape "
                                  f"{list(self.shapes[name])}, expected {list(shape)}")
        if name not in self.plans:
            t = _raw(self.src, name)
        else:
            blocks, scales = (_raw(self.src, p) for p in self.plans[name])
            try:
                t = dequantize_mxfp4(blocks, scales).transpose(-2, -1).contiguous()
            except ValueError as exc:
                raise WeightLoadError(f"{self.origin}: cannot dequantize {name!r} (mxfp4): "
                                      f"{exc}") from None
        return checked_tensor(t, name, self.origin, dtype or t.dtype, device)


def dequantizing(src: Any, config: Mapping[str, Any], origin: str) -> Any:
    """`src` wrapped in a :class:`DequantizedSource` when the config declares MXFP4 weights;
    `src` itself otherwise."""
    qc = read_quant_config(config, f"{origin}/config.json")
    if qc is None:
        return src
    return DequantizedSource(src, qc, origin)
