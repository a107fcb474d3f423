"""MXFP4 (OCP microscaling FP4) dequantization, the format gpt-oss publishes its experts in.

Each block of 32 values shares one E8M0 scale byte (a power of two, biased by 127); the
values are FP4 E2M1 codes, two per byte, the low nibble first. :func:`dequantize_mxfp4` is the
one function the gpt-oss expert loader (:mod:`mi_transformer.experts`) calls; the tests compare
it with transformers' own dequantization (``integrations/mxfp4.py``).
"""

from __future__ import annotations

import torch

from mi_core.plugin import WeightLoadError

#: FP4 E2M1 code -> value (bit 3 is the sign)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks [..., rows, G, 16] uint8 (two FP4 codes per byte, low nibble first), scales
    [..., rows, G] uint8 (E8M0: 2^(s - 127)) -> float32 [..., rows, G * 32], each row's 32-value
    groups in order (the row layout as stored: torch.nn.Linear's [out, in] for gpt-oss).

    A scale byte of 255 (E8M0's NaN) or a value beyond float32 is a WeightLoadError."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise WeightLoadError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and "
                              f"{scales.dtype}")
    if blocks.dim() < 2 or blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != tuple(
            scales.shape):
        raise WeightLoadError(f"MXFP4 blocks {list(blocks.shape)} and scales "
                              f"{list(scales.shape)} do not match ([..., G, 16] and [..., G])")
    if scales.numel() and int(scales.max()) == 255:
        raise WeightLoadError("MXFP4 scales hold 255 (NaN in E8M0)")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    flat_b, flat_s = blocks.reshape(-1, 16), scales.reshape(-1)
    out = torch.empty((flat_b.shape[0], 32), dtype=torch.float32, device=blocks.device)
    for r0 in range(0, flat_b.shape[0], _ROWS):  # chunks: the index tensors stay small
        b, s = flat_b[r0:r0 + _ROWS], flat_s[r0:r0 + _ROWS]
        codes = torch.stack((b & 0x0F, b >> 4), dim=-1).flatten(-2).long()  # [rows, 32]
        torch.ldexp(lut[codes], s.to(torch.int32)[:, None] - 127, out=out[r0:r0 + _ROWS])
    if not bool(torch.isfinite(out).all()):
        raise WeightLoadError("MXFP4 values overflow float32 (scales too large)")
    return out.view(*blocks.shape[:-2], blocks.shape[-2] * 32)


_ROWS = 1 << 18  # blocks of 32 values per chunk (8M values)
