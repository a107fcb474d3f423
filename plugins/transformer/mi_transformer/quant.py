"""Quantized checkpoints as published, dequantized at load.

Two forms are read, both as transformers' own dequantization reads them:

- **FP8, block-scaled** (``quantization_config.quant_method: "fp8"``, e.g. Qwen3-*-FP8,
  DeepSeek-V3): a linear weight ``X.weight`` [rows, cols] stored as float8 e4m3 with
  ``X.weight_scale_inv`` [ceil(rows / bh), ceil(cols / bw)] (F32 or BF16), one scale per
  (bh, bw) block of ``weight_block_size``: W = W_fp8 * scale of its block
  (:func:`dequantize_fp8`).
- **MXFP4** (``quant_method: "mxfp4"``, the only published form of gpt-oss): a stacked
  expert tensor ``X`` stored as ``X_blocks`` [E, rows, groups, 16] uint8 (two e2m1 values a
  byte, low nibble first) and ``X_scales`` [E, rows, groups] uint8 (an e8m0 exponent per
  group of 32 values: 2 ** (s - 127)) (:func:`dequantize_mxfp4`). transformers stores the
  dequantized expert tensor transposed, [E, groups * 32, rows]; :class:`DequantizedSource`
  gives it under the name ``X`` in that layout, as a BF16 checkpoint of the model holds it.

Dequantization is exact in F32 (an FP8 or FP4 value times a power of two or an F32 scale);
the result is then cast to the requested dtype and checked like any other weight. The
forward runs on the dequantized weights: activations are not quantized (transformers'
``dequantize=True`` path, which it also takes on CPU; its FP8 GPU kernels quantize the
activations per token group too, so their numbers differ from these by that rounding).

``quant_method: "gguf"`` is what transformers writes into the config of a model it loaded
from a GGUF file (``from_pretrained(..., gguf_file=...)``); the tensors it saves are already
dequantized floats, so the entry is accepted as the marker it is. Every other method (AWQ,
GPTQ, bitsandbytes, compressed-tensors, ModelOpt, ...) is refused by name; so are ModelOpt's
``hf_quant_config.json`` and quantization tensors a config does not declare
(:mod:`mi_transformer.quant_refusals`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import attrs
import torch

from mi_core.plugin import ConfigError, WeightLoadError, checked_tensor

from mi_transformer.quant_refusals import modelopt_message

#: The methods read here; any other ``quant_method`` is refused naming it.
SUPPORTED_METHODS = ("fp8", "mxfp4", "gguf")
#: Keys of each method's quantization_config known not to change the dequantized numbers:
#: which modules were left unquantized is read off the tensors themselves (a weight with a
#: scale is dequantized, one without is used as stored); ``dequantize`` is transformers'
#: own switch for what we always do.
_HARMLESS = {"fp8": {"modules_to_not_convert", "ignored_layers", "dequantize"},
             "mxfp4": {"modules_to_not_convert", "dequantize"},
             "gguf": {"gguf_file", "dequantize"}}
#: FP8 settings accepted only at the values implemented (key -> (values, why others are
#: not)). ``fmt``: DeepSeek's export says "e4m3", MiniMax-M2's "float8_e4m3fn" (torch's name
#: of the same format; transformers reads neither, the weights' safetensors dtype decides).
_FP8_ONLY = {"activation_scheme": (("dynamic",), "static activation scales (input_scale) are "
                                                 "not implemented"),
             "fmt": (("e4m3", "float8_e4m3fn"), "only float8 e4m3 weights are implemented"),
             "expert_dtype": (("fp8",), "only FP8 experts are implemented"),
             # (a Qwen3.5-MoE FP8 export says both false: block scales, which transformers'
             # FineGrainedFP8Config always reads and never names)
             "weight_per_tensor": ((False,), "per-tensor weight scales are not implemented"),
             "act_per_tensor": ((False,), "per-tensor activation scales are not implemented")}
#: ``scale_fmt`` values accepted: "float" (scales stored as F32 / BF16), and "ue8m0", the
#: declaration that every block scale is a power of two (DeepSeek-V3.1 publishes it with F32
#: ``weight_scale_inv`` tensors; transformers casts them to float8_e8m0fnu, exact for powers
#: of two). Under "ue8m0" a scale that is not a power of two is a WeightLoadError naming the
#: tensor (transformers would round it); scales stored as F8_E8M0 are refused by the
#: safetensors header check (dtype not read).
_SCALE_FMTS = ("float", "ue8m0")
#: e2m1 (FP4) code -> value; bit 3 is the sign (OCP microscaling spec, as transformers).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@attrs.frozen
class QuantConfig:
    """A validated ``quantization_config``: the method and, for FP8, the block size."""

    method: str
    block: tuple[int, int] = (128, 128)  # fp8 weight_block_size (rows, cols)
    scale_fmt: str = "float"  # fp8 scale_fmt: "float" or "ue8m0" (powers of two)


def read_quant_config(cfg: Mapping[str, Any], src: str) -> QuantConfig | None:
    """The checked ``quantization_config`` of a config dict (None when absent or null).

    A method other than :data:`SUPPORTED_METHODS`, a setting not implemented, or an unknown
    key inside it is a ConfigError naming it and the file."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return None
    where = f"{src}: quantization_config"
    if not isinstance(qc, Mapping):
        raise ConfigError(f"{where} = {qc!r}: expected a JSON object")
    method = qc.get("quant_method")
    if method is None and (qc.get("load_in_4bit") or qc.get("load_in_8bit")):
        method = "bitsandbytes"  # transformers 4's legacy form names no method: it is this one
    if method is None:  # (ModelOpt's own form says quant_algo; transformers refuses it too)
        algo = f" (quant_algo {qc['quant_algo']!r}: NVIDIA ModelOpt's form)" \
            if qc.get("quant_algo") is not None else ""
        raise ConfigError(f"{where} names no quant_method (its keys: {', '.join(sorted(qc))})"
                          f"{algo}: the quantization is not known, so not supported; load an "
                          f"unquantized copy of this model instead")
    if not isinstance(method, str):
        raise ConfigError(f"{where}.quant_method = {method!r}: expected a string")
    if method.lower().startswith("modelopt"):  # ModelOpt's config.json form ("modelopt")
        raise ConfigError(f"{where}.quant_method = {method!r}: {modelopt_message(qc)}")
    if method not in SUPPORTED_METHODS:
        raise ConfigError(f"{where}.quant_method = {method!r} is not supported: mi-transformer "
                          f"reads block-scaled 'fp8' and 'mxfp4' checkpoints (dequantized at "
                          f"load) and 'gguf' (transformers' marker of weights it already "
                          f"dequantized); load an unquantized copy of this model instead")
    known = {"quant_method"} | _HARMLESS[method]
    block = (128, 128)
    if method == "fp8":
        for key, (values, why) in _FP8_ONLY.items():  # (JSON equality: 0 is not false)
            if qc.get(key) is not None and not any(
                    type(qc[key]) is type(v) and qc[key] == v for v in values):
                raise ConfigError(f"{where}.{key} = {qc[key]!r} is not supported ({why})")
        if qc.get("modules_to_convert"):
            raise ConfigError(f"{where}.modules_to_convert = {qc['modules_to_convert']!r} is "
                              f"not supported (quantized embeddings are not implemented)")
        scale_fmt = qc.get("scale_fmt")
        if scale_fmt is None:
            scale_fmt = "float"
        if scale_fmt not in _SCALE_FMTS:
            raise ConfigError(f"{where}.scale_fmt = {scale_fmt!r} is not supported (block "
                              f"scales are read as 'float' or 'ue8m0' powers of two)")
        block = _block_size(qc.get("weight_block_size"), where)
        known |= set(_FP8_ONLY) | {"weight_block_size", "modules_to_convert", "scale_fmt"}
    unknown = sorted(k for k, v in qc.items() if v is not None and k not in known)
    if unknown:
        raise ConfigError(f"{where} has keys this backend does not read (they may change the "
                          f"numbers): {', '.join(unknown)}")
    return QuantConfig(method, block, scale_fmt if method == "fp8" else "float")


def _block_size(v: Any, where: str) -> tuple[int, int]:
    if v is None:  # transformers' FineGrainedFP8Config default
        return (128, 128)
    if not (isinstance(v, list) and len(v) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v)):
        raise ConfigError(f"{where}.weight_block_size = {v!r}: expected two integers >= 1")
    return (v[0], v[1])


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor,
                   block: tuple[int, int]) -> torch.Tensor:
    """Block-scaled FP8 -> F32: ``weight`` [..., rows, cols] (float8), ``scale_inv``
    [..., ceil(rows / bh), ceil(cols / bw)]; every (bh, bw) block of the weight times its
    scale (edge blocks may be partial). Returns F32 [..., rows, cols]; a scale grid of any
    other shape is a ValueError naming both shapes."""
    rows, cols = weight.shape[-2:]
    bh, bw = block
    grid = (math.ceil(rows / bh), math.ceil(cols / bw))
    if tuple(scale_inv.shape) != (*weight.shape[:-2], *grid):
        raise ValueError(f"scale grid {list(scale_inv.shape)} does not fit weight "
                         f"{list(weight.shape)} in blocks of {list(block)} (expected "
                         f"{[*weight.shape[:-2], *grid]})")
    pad = (grid[0] * bh - rows, grid[1] * bw - cols)
    w = weight.to(torch.float32, copy=True)  # scaled in place below
    if any(pad):  # partial edge blocks: pad to whole blocks, crop after
        w = torch.nn.functional.pad(w, (0, pad[1], 0, pad[0]))
    lead = w.shape[:-2]
    w = w.view(*lead, grid[0], bh, grid[1], bw)
    w.mul_(scale_inv.float().view(*lead, grid[0], 1, grid[1], 1))
    w = w.view(*lead, grid[0] * bh, grid[1] * bw)
    return w[..., :rows, :cols].contiguous() if any(pad) else w


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 -> F32: ``blocks`` [..., groups, 16] uint8 (two e2m1 codes a byte, the low
    nibble first), ``scales`` [..., groups] uint8 (e8m0: 2 ** (s - 127) per group of 32).
    Returns F32 [..., groups * 32] (the last dimension unpacked, in storage order); a shape
    mismatch is a ValueError naming both shapes."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and "
                         f"{scales.dtype}")
    if blocks.dim() < 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} "
                         f"do not match ([..., groups, bytes] and [..., groups])")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    codes = torch.arange(256)
    pairs = torch.stack([lut[codes & 0x0F], lut[codes >> 4]], dim=-1)  # byte -> (low, high)
    out = pairs[blocks.int()].flatten(-2)  # [..., groups, 32]: the low nibble first
    out.mul_(torch.exp2(scales.float() - 127).unsqueeze(-1))  # exact: a power of two
    return out.flatten(-2)


def _raw(src: Any, name: str) -> torch.Tensor:
    """A tensor as stored (no dtype check): integer blocks and float8 weights are data here."""
    tensors = getattr(src, "tensors", None)
    if isinstance(tensors, Mapping):  # an in-memory source
        return tensors[name]
    return src.get(name, check=False)


@attrs.define
class _Plan:
    how: str  # "fp8" | "mxfp4"
    parts: tuple[str, str]  # fp8: (weight, scale_inv); mxfp4: (blocks, scales)


class DequantizedSource:
    """A TensorSource (``names`` / ``shapes`` / ``get``) over a quantized checkpoint: the
    tensors as transformers' dequantized model holds them. FP8 weights keep their names (the
    ``weight_scale_inv`` tensors are consumed); MXFP4 ``X_blocks`` + ``X_scales`` become
    ``X`` [E, groups * 32, rows]. A scale without its weight (or the reverse), a grid that
    does not fit, or a float8 tensor without a scale is a WeightLoadError naming it."""

    def __init__(self, src: Any, qc: QuantConfig, origin: str) -> None:
        self.src, self.qc, self.origin = src, qc, origin
        self.files = getattr(src, "files", None)
        raw: Mapping[str, tuple[int, ...]] = src.shapes
        self.plans: dict[str, _Plan] = {}
        if qc.method == "fp8":
            self._plan_fp8(raw)
        elif qc.method == "mxfp4":
            self._plan_mxfp4(raw)
        used = {p for plan in self.plans.values() for p in plan.parts}
        self.shapes: dict[str, tuple[int, ...]] = {
            n: tuple(s) for n, s in raw.items() if n not in used}
        for name, plan in self.plans.items():
            self.shapes[name] = self._logical_shape(plan, raw)

    def _plan_fp8(self, raw: Mapping[str, tuple[int, ...]]) -> None:
        bh, bw = self.qc.block
        for name, shape in raw.items():
            if not name.endswith(".weight_scale_inv"):
                continue
            w = name[: -len("_scale_inv")]
            if w not in raw or len(raw[w]) < 2:
                raise WeightLoadError(f"{self.origin}: FP8 scale {name!r} has no 2-D weight "
                                      f"{w!r} beside it")
            rows, cols = raw[w][-2:]
            want = (*raw[w][:-2], math.ceil(rows / bh), math.ceil(cols / bw))
            if tuple(shape) != want:
                raise WeightLoadError(f"{self.origin}: FP8 scale {name!r} has shape "
                                      f"{list(shape)}; weight {w!r} {list(raw[w])} in blocks "
                                      f"of {[bh, bw]} (weight_block_size) needs {list(want)}")
            self.plans[w] = _Plan("fp8", (w, name))

    def _plan_mxfp4(self, raw: Mapping[str, tuple[int, ...]]) -> None:
        for name in raw:
            for suffix, other in (("_blocks", "_scales"), ("_scales", "_blocks")):
                if name.endswith(suffix) and name[: -len(suffix)] + other not in raw:
                    raise WeightLoadError(f"{self.origin}: MXFP4 tensor {name!r} has no "
                                          f"{name[: -len(suffix)] + other!r} beside it")
            if not name.endswith("_blocks"):
                continue
            base = name[: -len("_blocks")]
            blocks, scales = raw[name], raw[base + "_scales"]
            if len(blocks) != 4 or tuple(blocks[:-1]) != tuple(scales):
                raise WeightLoadError(f"{self.origin}: MXFP4 tensors {name!r} {list(blocks)} "
                                      f"and {base + '_scales'!r} {list(scales)} are not "
                                      f"[experts, rows, groups, 16] and [experts, rows, groups]")
            self.plans[base] = _Plan("mxfp4", (name, base + "_scales"))

    @staticmethod
    def _logical_shape(plan: _Plan, raw: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
        if plan.how == "fp8":
            return tuple(raw[plan.parts[0]])
        e, rows, groups, nbytes = raw[plan.parts[0]]
        return (e, groups * nbytes * 2, rows)  # transformers' layout: transposed

    def names(self) -> list[str]:
        return list(self.shapes)

    def dequantized(self, name: str) -> torch.Tensor:
        """The F32 dequantization of quantized tensor `name` (in the logical layout)."""
        plan = self.plans[name]
        a, b = (_raw(self.src, p) for p in plan.parts)
        try:
            if plan.how == "fp8":
                if a.dtype not in _FP8_DTYPES:
                    raise ValueError(f"weight dtype {a.dtype} is not float8 e4m3")
                if self.qc.scale_fmt == "ue8m0" and not _powers_of_two(b):
                    raise ValueError(f"quantization_config.scale_fmt = 'ue8m0' declares "
                                     f"power-of-two block scales, but {plan.parts[1]!r} "
                                     f"holds others (transformers would round them)")
                return dequantize_fp8(a, b, self.qc.block)
            return dequantize_mxfp4(a, b).transpose(-2, -1).contiguous()
        except ValueError as exc:
            raise WeightLoadError(f"{self.origin}: cannot dequantize {name!r} "
                                  f"({plan.how}): {exc}") from None

    def get(self, name: str, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None,
            shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if name not in self.shapes:
            raise WeightLoadError(f"{self.origin}: tensor {name!r} not found")
        if shape is not None and tuple(self.shapes[name]) != tuple(shape):
            raise WeightLoadError(f"{self.origin}: tensor {name!r} has shape "
                                  f"{list(self.shapes[name])}, expected {list(shape)}")
        if name in self.plans:
            t = self.dequantized(name)
        else:
            t = _raw(self.src, name)
            if t.dtype in _FP8_DTYPES:
                raise WeightLoadError(f"{self.origin}: tensor {name!r} is float8 but has no "
                                      f"weight_scale_inv beside it; its numbers would be off "
                                      f"by its scale")
        return checked_tensor(t, name, self.origin, dtype or t.dtype, device)


def _powers_of_two(scales: torch.Tensor) -> bool:
    """Whether every element of `scales` is a positive power of two (an exact e8m0 value)."""
    mantissa, _ = torch.frexp(scales.float())
    return bool((mantissa == 0.5).all())


_FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz")
                    if hasattr(torch, n))


def logical_shapes(config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], src: str
                   ) -> Mapping[str, tuple[int, ...]]:
    """The tensor shapes a quantized checkpoint has once dequantized (for detection, which
    reads headers only); `shapes` itself when the config has no quantization_config."""
    qc = read_quant_config(config, src)
    if qc is None or qc.method == "gguf":
        return shapes
    return DequantizedSource(_ShapesOnly(shapes), qc, src).shapes


@attrs.define
class _ShapesOnly:
    shapes: Mapping[str, tuple[int, ...]]


def dequantizing(src: Any, config: Mapping[str, Any], origin: str) -> Any:
    """`src` wrapped in a :class:`DequantizedSource` when the config declares FP8 or MXFP4
    weights; `src` itself otherwise."""
    qc = read_quant_config(config, f"{origin}/config.json")
    if qc is None or qc.method == "gguf":
        return src
    return DequantizedSource(src, qc, origin)
