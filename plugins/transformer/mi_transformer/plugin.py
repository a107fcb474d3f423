"""Registration of mi-transformer with mi-core (the same hooks a third-party plugin implements)."""

from __future__ import annotations

from typing import Any

from mi_core.plugin import BackendSpec, Detection, MIError, ModelSource
from mi_core import plugin_impl

from mi_transformer.config import FAMILIES, UnknownKeysError, parse_config
from mi_transformer.config.size import ConfigTooLarge
from mi_transformer.quant import logical_shapes
from mi_transformer.quant_refusals import quantized_tensors_refusal, refuse_modelopt
from mi_transformer.weights import check_tensors

BACKEND = "transformer"
#: the llama.cpp architectures mi_transformer.gguf reads (its GGUF_ARCHES; not imported here,
#: the gguf package is optional)
_GGUF = ("llama, qwen2, qwen3, gemma, gemma2, gemma3, phi2, phi3, starcoder2, olmo2, olmoe, "
         "gpt2, gptneox, falcon, stablelm, command-r, granite, qwen2moe, qwen3moe, exaone4, "
         "seed_oss, ernie4_5, glm4, glm4moe, ernie4_5-moe, hunyuan-dense, apertus, gpt-oss, "
         "deepseek2, llama4, olmo, smollm3, mamba, mamba2, jamba, granitehybrid, nemotron_h, "
         "nemotron_h_moe, qwen3next, qwen35, qwen35moe, falcon-h1, lfm2, lfm2moe, gemma3n, gemma4")


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
    config keys that are not understood or the missing / unexpected tensors. ``implements``
    says whether the model_type is one of :data:`FAMILIES` (the core's report then says
    plainly when no plugin implements it). Quantized checkpoints are judged by the tensors
    they hold once dequantized; a ModelOpt export (``hf_quant_config.json``) or quantization
    tensors the config does not declare are refused naming the format
    (:mod:`mi_transformer.quant_refusals`)."""
    path = source.path
    if source.is_file:
        if path.suffix.lower() == ".gguf":
            return _detect_gguf(path)
        return Detection(BACKEND, 0.0, f"{path.name}: single files must be .gguf")
    cfg = source.config
    if cfg is None:
        return Detection(BACKEND, 0.0, "no config.json")
    mt = cfg.get("model_type")
    known = isinstance(mt, str) and mt in FAMILIES
    unknown = "" if known else f"mi-transformer does not implement model_type {mt!r}; "
    try:
        refuse_modelopt(path)  # before the config: ModelOpt's config.json may say nothing
    except MIError as exc:
        return Detection(BACKEND, 0.0, str(exc), implements=known)
    try:
        # auto-config reads layouts off the tensors (as dequantized); a known family's
        # tensors are checked when it loads
        shapes = source.tensor_shapes if known else \
            logical_shapes(cfg, source.tensor_shapes, str(path / "config.json"))
        ac = parse_config(cfg, str(path / "config.json"), list(shapes))
    except UnknownKeysError as exc:
        what = f"{unknown}as LLaMA-like auto-config, its config keys are" if unknown \
            else f"model_type {mt!r}: config keys"
        return Detection(BACKEND, 0.0, f"{what} not understood (they may change the numbers): "
                                       f"{', '.join(exc.keys)}",
                         config_keys=list(exc.keys), implements=known)
    except ConfigTooLarge as exc:  # recognised, too large for this machine: loading says so
        return Detection(BACKEND, 0.1, f"model_type {mt!r}: {exc}", implements=known)
    except MIError as exc:
        what = "a supported family but its config is invalid" if known else \
            "its config is not LLaMA-like"
        return Detection(BACKEND, 0.0, f"{unknown or f'model_type {mt!r} is '}{what}: {exc}",
                         implements=known)
    if known:
        why = _undeclared_quantization(cfg, ac, shapes, path)
        if why:
            return Detection(BACKEND, 0.0, why, implements=True)
        return Detection(BACKEND, 0.9, f"model_type {mt!r} is a supported family",
                         implements=True)
    if not shapes:
        return Detection(BACKEND, 0.0, f"model_type {mt!r} unknown and no safetensors to inspect")
    why = quantized_tensors_refusal(shapes, lambda: check_tensors(ac, shapes).unexpected,
                                    str(path))
    if why:
        return Detection(BACKEND, 0.0, f"{unknown}{why}")
    chk = check_tensors(ac, shapes)
    if chk.ok:
        return Detection(BACKEND, 0.5, f"model_type {mt!r} unknown; every config key and tensor "
                                       f"is LLaMA's (auto-config: assumes LLaMA arithmetic)")
    why = "; ".join(chk.misshaped[:3]) if chk.misshaped else ""
    return Detection(BACKEND, 0.0, f"model_type {mt!r} unknown and its tensors do not match a "
                                   f"LLaMA-like layout" + (f" ({why})" if why else ""),
                     missing=chk.missing, unexpected=chk.unexpected)


def _undeclared_quantization(cfg: dict[str, Any], ac: Any,
                             shapes: dict[str, tuple[int, ...]], path: Any) -> str | None:
    """A known family's refusal of quantization tensors its config does not declare (the
    rest of its tensor check waits for loading, which names what is wrong); None when there
    are none, or when the declared quantization's tensors are malformed (loading says how)."""
    try:
        logical = logical_shapes(cfg, shapes, str(path / "config.json"))
    except MIError:
        return None
    return quantized_tensors_refusal(logical, lambda: check_tensors(ac, logical).unexpected,
                                     str(path))


def _detect_gguf(path: Any) -> Detection:
    """A GGUF file by its ``general.architecture`` (the first key/values only): one this
    plugin reads 0.9; another 0, naming it (mi-rwkv claims ``rwkv6`` / ``rwkv7``); a file
    whose header cannot be read 0.1, so that loading names what is wrong."""
    try:
        from mi_core.gguf import gguf_architecture

        arch = gguf_architecture(path)
    except ImportError as exc:  # the GGUF ring needs numpy
        return Detection(BACKEND, 0.0, f"reading GGUF needs numpy and gguf (pip install "
                                       f"'mi-transformer[gguf]'): {exc}")
    except MIError as exc:
        return Detection(BACKEND, 0.1, f"GGUF file whose header cannot be read: {exc}",
                         implements=True)
    if arch in _GGUF.split(", "):
        return Detection(BACKEND, 0.9, f"GGUF file of architecture {arch!r}", implements=True,
                         gguf_architecture=arch)
    if arch is None:
        return Detection(BACKEND, 0.1, "GGUF file without general.architecture",
                         implements=True)
    return Detection(BACKEND, 0.0, f"mi-transformer does not implement GGUF architecture "
                                   f"{arch!r} (it reads {_GGUF})", gguf_architecture=arch)


@plugin_impl
def mi_checkpoint_from_config(config: Any, directory: Any, norm_gain: float) -> bool | None:
    """A TransformerLens config written as a checkpoint of the family that holds its shape
    (:mod:`mi_transformer.tl_config`)."""
    from mi_transformer.tl_config import write_checkpoint

    return write_checkpoint(config, directory, norm_gain)


@plugin_impl
def mi_default_model() -> str | None:
    """The embedded SmolLM2 GGUF, when mi_transformer.gguf can find it."""
    try:
        from mi_transformer import gguf

        path = gguf.default_model_path()
    except Exception:  # gguf module / package not available, or model not installed
        return None
    return str(path) if path is not None else None
