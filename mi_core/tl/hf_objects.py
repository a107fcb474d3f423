"""TransformerLens' ``hf_model=`` and ``tokenizer=``: a transformers model or tokenizer object
handed to ``from_pretrained`` / ``boot_transformers`` / ``HookedTransformer(model, tokenizer)``.

TransformerLens converts such a model's weights itself; mi-core's backends load checkpoints,
so the object is written as one (``config.json`` + ``model.safetensors`` + the tokenizer's
files) in a temporary directory that lives as long as the model that loads it, and loaded from
there by the same backends as any checkpoint. A model transformers dequantized while loading
a GGUF file (``gguf_file=``) holds plain tensors: its ``quantization_config`` is dropped; other
quantized models (bitsandbytes, GPTQ, ...) are refused, as TransformerLens refuses them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch

from mi_core import CapabilityError, HFTokenizer, InputError, MITokenizer, TokenizerError


def _config_dict(hf_model: Any) -> dict[str, Any]:
    config = getattr(hf_model, "config", None)
    if config is None or not hasattr(config, "to_json_string"):
        raise InputError(f"hf_model= must be a transformers PreTrainedModel (with a .config), "
                         f"got {type(hf_model).__name__}")
    cfg = json.loads(config.to_json_string(use_diff=False))
    quant = cfg.pop("quantization_config", None) or {}
    method = str(quant.get("quant_method", "")).lower()
    if quant and not method.endswith("gguf"):  # "gguf" / "QuantizationMethod.GGUF"
        raise CapabilityError(
            f"hf_model=: a {method or 'quantized'} model's weights are packed, not plain "
            f"tensors; load it dequantized (as TransformerLens requires)")
    cfg.pop("_name_or_path", None)
    return cfg


_WRAPPED = "._original_component"


def _module_state(hf_model: Any) -> dict[str, torch.Tensor]:
    """The model's own tensors. TransformerLens' bridge, booted with ``hf_model=``, wraps the
    object's modules in place (their tensors then sit under ``._original_component`` and
    under the bridge's aliases) and ``enable_compatibility_mode`` processes those weights in
    place (a change that keeps the logits: norms folded, writing weights centred, the output
    embedding untied). Those tensors are read under the names the model's class gives them
    (a skeleton of it on the meta device); an output bias the bridge added is dropped where it
    is zero (models whose head has no bias) and refused where folding put values there (the
    checkpoint format has no place for it)."""
    state = hf_model.state_dict()
    if not any(_WRAPPED in name for name in state):
        return state
    with torch.device("meta"):
        names = list(type(hf_model)(hf_model.config).state_dict())
    own = {n.replace(_WRAPPED, ""): t for n, t in state.items() if _WRAPPED in n}
    bias = own.get("lm_head.bias")
    if bias is not None and "lm_head.bias" not in names and bool(bias.abs().max() > 0):
        raise CapabilityError(
            "hf_model=: this transformers model was wrapped and processed in place by "
            "TransformerLens' TransformerBridge (enable_compatibility_mode folded the final "
            "norm's bias into an lm_head.bias its checkpoint format has no place for); load a "
            "fresh copy of the model for mi-core")
    missing = [n for n in names if n not in own]
    if missing:
        raise InputError(f"hf_model=: the object lacks its class's tensors {missing[:4]} "
                         f"(wrapped by TransformerLens' bridge?); pass a fresh copy")
    return {n: own[n] for n in names}


def _tensors(hf_model: Any, tied: bool) -> tuple[dict[str, torch.Tensor], bool]:
    """(the state dict with each tied tensor once (its first name), others contiguous CPU
    copies (safetensors stores no shared memory); whether a tied tensor was left out)."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[tuple[int, int], str] = {}
    dropped = False
    for name, t in _module_state(hf_model).items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen and tied and name.endswith("lm_head.weight"):
            dropped = True
            continue  # the tied output embedding: config.json says so
        seen.setdefault(key, name)
        out[name] = t.detach().to("cpu").contiguous().clone()
    return out, dropped


def checkpoint_dir(hf_model: Any, tokenizer: Any = None) -> Path:
    """A temporary checkpoint directory holding `hf_model`'s config and weights (and
    `tokenizer`'s files); remove it with :func:`remove_with` once a model owns it."""
    from safetensors.torch import save_file

    cfg = _config_dict(hf_model)
    out = Path(tempfile.mkdtemp(prefix="mi-tl-hf-model-"))
    try:
        tied = bool(cfg.get("tie_word_embeddings", False))
        tensors, dropped = _tensors(hf_model, tied)
        if tied and not dropped and "lm_head.weight" in tensors:
            cfg["tie_word_embeddings"] = False  # untied in memory (TransformerLens' bridge does)
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            save_tokenizer(tokenizer, out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out


def remove_with(owner: Any, directory: Path) -> None:
    """Remove `directory` when `owner` is garbage collected (or at exit)."""
    weakref.finalize(owner, shutil.rmtree, str(directory), True)


def save_tokenizer(tokenizer: Any, directory: Path) -> None:
    if not hasattr(tokenizer, "save_pretrained"):
        raise InputError(f"tokenizer= must be a transformers tokenizer (PreTrainedTokenizer"
                         f"Base), got {type(tokenizer).__name__}")
    tokenizer.save_pretrained(str(directory))
    if not (directory / "tokenizer.json").exists():
        raise TokenizerError(f"tokenizer=: {type(tokenizer).__name__} wrote no tokenizer.json "
                             f"(mi-core reads HuggingFace fast tokenizers); pass a fast one")


def mi_tokenizer(tokenizer: Any) -> MITokenizer:
    """mi-core's tokenizer of a transformers tokenizer object (its saved ``tokenizer.json``)."""
    directory = Path(tempfile.mkdtemp(prefix="mi-tl-tokenizer-"))
    try:
        save_tokenizer(tokenizer, directory)
        tok = HFTokenizer.from_directory(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if tok is None:
        raise TokenizerError(f"tokenizer=: no tokenizer could be read from "
                             f"{type(tokenizer).__name__}'s saved files")
    template = getattr(tokenizer, "chat_template", None)
    if template is not None:  # the files are gone: apply_chat_template reads it from here
        tok.chat_template = template  # type: ignore[attr-defined]
    return tok


__all__ = ["checkpoint_dir", "mi_tokenizer", "remove_with", "save_tokenizer"]
