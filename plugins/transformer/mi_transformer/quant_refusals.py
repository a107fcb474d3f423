"""Quantized checkpoints that are not read, refused up front naming their format.

Two ways a checkpoint can be quantized without a ``quantization_config`` that
:mod:`mi_transformer.quant` reads (and refuses by name when it is not FP8 / MXFP4):

- **NVIDIA ModelOpt exports** (e.g. nvidia/Llama-3.1-70B-Instruct-FP8, the Nemotron FP8 and
  NVFP4 checkpoints) describe their quantization in a separate ``hf_quant_config.json`` beside
  config.json: ``{"producer": {"name": "modelopt", "version": ...}, "quantization":
  {"quant_algo": "FP8" | "NVFP4" | ..., "kv_cache_quant_algo": "FP8" | null,
  "group_size": 16, "exclude_modules": [...]}}`` (the file vLLM and TensorRT-LLM read; vLLM
  also takes the flat form, the keys of ``quantization`` at the top). Their config.json may
  say nothing. The tensors then hold float8 / packed FP4 weights with ``weight_scale``,
  ``weight_scale_2`` (NVFP4's global scale), ``input_scale`` (static activation scales) and
  ``k_scale`` / ``v_scale`` (KV-cache scales). The runtimes that read them quantize the
  activations and KV cache with those static scales, so a forward on dequantized weights
  would not give their numbers: :func:`refuse_modelopt` refuses the directory, naming
  ModelOpt, its ``quant_algo`` and the file. A file that declares neither weight nor KV-cache
  quantization (both null) is no refusal by itself: the tensors decide.
- **Quantization tensors with a config that says nothing** (a copied config.json, a tool that
  dropped the quantization_config): :func:`quantized_tensors_refusal` names the likely format
  from the tensors the family does not use (``weight_scale_inv``: block-scaled FP8;
  ``_blocks`` / ``_scales``: MXFP4; ``qweight`` / ``qzeros``: GPTQ / AWQ; ``weight_packed``:
  compressed-tensors; ``absmax`` / ``quant_map``: bitsandbytes; ...) instead of a list of
  unexpected tensors.

Both are :class:`~mi_core.errors.UnsupportedModelError` (detection reports them as the
backend's reason, so ``MIModel.from_pretrained`` and ``mi check`` say the same); an
``hf_quant_config.json`` that is not a JSON object is a ConfigError naming it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mi_core.plugin import ConfigError, UnsupportedModelError

#: ModelOpt's quantization description, beside config.json
MODELOPT_FILE = "hf_quant_config.json"
_INSTEAD = "load an unquantized (BF16 / F32) copy of this model instead"

#: (format, pattern on a tensor name), most specific first: a name is given the first format
#: it matches, and the first format found is the one named. Names from the published layouts
#: (vLLM's modelopt.py / compressed_tensors, transformers' quantizer integrations).
SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (fmt, re.compile(p)) for fmt, p in (
        ("bitsandbytes", r"\.weight\.(absmax|quant_map|nested_absmax|nested_quant_map|"
                         r"quant_state\..+)$|\.(SCB|weight_format)$"),
        ("GPTQ / AWQ (packed integer weights)", r"\.(qweight|qzeros|g_idx)$"),
        ("compressed-tensors (packed integer weights)",
         r"\.weight_(packed|shape|zero_point|g_idx)$"),
        ("NVFP4 (ModelOpt: weight_scale_2)", r"\.weight_scale_2$"),
        ("NVFP4 (compressed-tensors: global scales)", r"\.(weight|input)_global_scale$"),
        ("block-scaled FP8 (weight_scale_inv) without quantization_config.quant_method 'fp8'",
         r"\.weight_scale_inv$"),
        ("MXFP4 (_blocks / _scales) without quantization_config.quant_method 'mxfp4'",
         r"_(blocks|scales)$"),
        ("FP8 with per-tensor / per-channel scales (ModelOpt, compressed-tensors, fbgemm_fp8: "
         "weight_scale, input_scale)",
         r"\.(weight_scale|input_scale|input_scale_ub|output_scale)$"),
        ("EETQ (weight_scales)", r"\.weight_scales$"),
        ("KV-cache quantization scales (k_scale / v_scale / kv_scale)",
         r"\.(k_scale|v_scale|q_scale|kv_scale)$"),
    ))


def _format_of(name: str) -> str | None:
    return next((fmt for fmt, pat in SIGNATURES if pat.search(name)), None)


def read_modelopt(directory: Path) -> dict[str, Any] | None:
    """The ``quantization`` object of `directory`'s ``hf_quant_config.json`` (the flat form
    as is), with ``producer`` added when the file names one; None when there is no file. A
    file that is not a JSON object (or whose ``quantization`` is not one) is a ConfigError
    naming it."""
    f = directory / MODELOPT_FILE
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{f}: cannot be read as JSON ({exc}); it is NVIDIA ModelOpt's "
                          f"quantization description, which is not supported") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{f}: expected a JSON object, got {type(data).__name__}")
    q = data.get("quantization", data)
    if not isinstance(q, dict):
        raise ConfigError(f"{f}: 'quantization' = {q!r}: expected a JSON object")
    producer = data.get("producer")
    return {**q, "producer": producer} if producer is not None else dict(q)


def modelopt_message(q: Mapping[str, Any]) -> str:
    """The refusal of a ModelOpt quantization description `q` (quant_algo, ...): it names
    ModelOpt, each declared algorithm and says it is not supported (the caller names the
    file)."""
    said = [f"{k} {q[k]!r}" for k in ("quant_algo", "kv_cache_quant_algo", "group_size")
            if q.get(k) is not None]
    prod = q.get("producer")
    if isinstance(prod, Mapping) and prod.get("name"):
        said.append(f"producer {prod['name']} {prod.get('version', '')}".rstrip())
    return (f"NVIDIA ModelOpt quantization ({', '.join(said) or 'no quant_algo'}) is "
            f"not supported: its scales (weight_scale, weight_scale_2, input_scale, k_scale / "
            f"v_scale) are applied with static activation and KV-cache quantization, which a "
            f"forward on dequantized weights would not reproduce (mi-transformer reads "
            f"quantization_config.quant_method 'fp8' block-scaled and 'mxfp4' checkpoints); "
            f"{_INSTEAD}")


def refuse_modelopt(directory: Path) -> None:
    """UnsupportedModelError when `directory` holds an ``hf_quant_config.json`` declaring
    quantized weights or a quantized KV cache (a non-null ``quant_algo`` or
    ``kv_cache_quant_algo``); ConfigError when that file is malformed; None otherwise."""
    q = read_modelopt(directory)
    if q is None or (q.get("quant_algo") is None and q.get("kv_cache_quant_algo") is None):
        return
    raise UnsupportedModelError(f"{directory / MODELOPT_FILE}: {modelopt_message(q)}")


def quantized_tensors_refusal(shapes: Mapping[str, tuple[int, ...]],
                              unexpected: Callable[[], Sequence[str]], origin: str
                              ) -> str | None:
    """The refusal naming the likely quantization format when tensors the family does not
    use (`unexpected`, e.g. ``lambda: check_tensors(cfg, shapes).unexpected``) match
    :data:`SIGNATURES`; None when none does. `shapes` as the weights load (quantized tensors
    already read are consumed); `unexpected` is called only when some name of `shapes`
    matches at all (free for ordinary checkpoints; a callable, because the weight table is
    :mod:`mi_transformer.weights`', which imports the config, which imports this)."""
    if not any(_format_of(n) for n in shapes):
        return None
    found: dict[str, list[str]] = {}
    for name in unexpected():
        fmt = _format_of(name)
        if fmt is not None:
            found.setdefault(fmt, []).append(name)
    if not found:
        return None
    order = [fmt for fmt, _ in SIGNATURES if fmt in found]
    names = [n for fmt in order for n in found[fmt]]
    also = f" (also: {'; '.join(order[1:])})" if len(order) > 1 else ""
    return (f"{origin}: quantized weights that its config.json does not declare, likely "
            f"{order[0]}{also}: not supported; quantization tensors: {', '.join(names[:6])}"
            + (f" ... ({len(names)} in all)" if len(names) > 6 else "") + f"; {_INSTEAD}")
