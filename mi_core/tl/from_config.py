"""``HookedTransformer(cfg)``: TransformerLens' randomly initialised model of a
``HookedTransformerConfig``, for the shape tests and toy models use.

mi-core runs checkpoints through its backends, so the config becomes one: the first plugin
whose format can express it (hook ``mi_checkpoint_from_config``) writes a checkpoint
(``config.json`` + ``model.safetensors``, zero but for the norm gains) into a temporary
directory that lives as long as the model, loaded as any checkpoint is. The weights are then
drawn as TransformerLens' ``init_weights`` draws them (``init_mode="gpt2"``, the only mode:
every ``W_*`` parameter, in ``named_parameters`` order, from ``N(0, initializer_range)``, after
``torch.manual_seed(cfg.seed)`` when a seed is set; norms 1, biases 0), so the same seed gives
TransformerLens' weights; ``model.load_state_dict(tl_model.state_dict())`` copies another
model's. A config no installed plugin can express is refused with a
:class:`mi_core.CapabilityError`: the plugin's names the fields its format cannot hold (the
built-in transformer backend's holds the shapes it computes exactly: learned or rotary
positions, LayerNorm or RMS norms, plain, gated or no MLPs, grouped-query attention).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from mi_core import CapabilityError

#: TransformerLens' buffers, which a state dict of its model holds and mi-core builds itself
BUFFERS = ("attn.mask", "attn.IGNORE", "attn.rotary_sin", "attn.rotary_cos")


def complete(cfg: Any, tokenizer: Any = None) -> Any:
    """A copy of `cfg` with TransformerLens' derived fields (``d_mlp = 4 * d_model``,
    ``n_heads = d_model // d_head``, ``d_vocab = -1`` from the tokenizer) filled in."""
    cfg = dataclasses.replace(cfg)
    if cfg.d_vocab == -1 and tokenizer is not None:  # TransformerLens' set_tokenizer
        cfg.d_vocab = max(tokenizer.vocab.values()) + 1
        cfg.d_vocab_out = cfg.d_vocab if cfg.d_vocab_out == -1 else cfg.d_vocab_out
    if cfg.n_heads == -1:
        cfg.n_heads = cfg.d_model // cfg.d_head
    if cfg.d_mlp is None and not cfg.attn_only:
        cfg.d_mlp = 4 * cfg.d_model
    return cfg


def checkpoint_dir(cfg: Any) -> Path:
    """A temporary checkpoint of `cfg` (completed), written by the first plugin whose format
    can express it (``mi_checkpoint_from_config``): norm gains 2 (a gain of 1 everywhere
    reads as folded norms, ``LNPre``, and the tree would have no ``ln.w`` / ``ln.b``; set to
    1 by :func:`adopt`), every other tensor 0."""
    from mi_core.plugin import get_plugin_manager

    if cfg.init_mode != "gpt2":  # the only init_mode init_weights draws as TransformerLens
        raise CapabilityError(f"HookedTransformer(cfg): init_mode={cfg.init_mode!r} (needs "
                              f"'gpt2', the init_mode mi_core.tl draws)")
    out = Path(tempfile.mkdtemp(prefix="mi-tl-cfg-model-"))
    try:  # a plugin's CapabilityError names the fields its format cannot hold
        written = get_plugin_manager().hook.mi_checkpoint_from_config(
            config=cfg, directory=out, norm_gain=2.0)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    if not written:
        shutil.rmtree(out, ignore_errors=True)
        raise CapabilityError(
            "HookedTransformer(cfg): no installed plugin can build a model from this config "
            "(mi_checkpoint_from_config; install the mi-core extra of the generic transformer "
            "backend), or load a checkpoint with from_pretrained")
    return out


def adopt(model: Any, cfg: Any) -> None:
    """`model` (built on :func:`checkpoint_dir` of `cfg`) takes `cfg`'s fields, owns the
    directory, and gets TransformerLens' initial weights (unless ``cfg.init_weights`` is
    False: then norms 1 and every other weight 0)."""
    from mi_core.tl.hf_objects import remove_with

    remove_with(model, Path(model.mi_model.source))
    cfg.default_prepend_bos = model.cfg.default_prepend_bos
    cfg.tokenizer_prepends_bos = model.cfg.tokenizer_prepends_bos
    cfg.n_params = model.cfg.n_params
    cfg.device = model.cfg.device
    model.cfg = cfg
    with torch.no_grad():  # TransformerLens' norms start at gain 1, bias 0
        for name, param in model.named_parameters():
            if name.endswith((".w", ".b")) and (name.startswith("ln_final.")
                                                or ".ln1." in name or ".ln2." in name):
                param.fill_(1.0 if name.endswith(".w") else 0.0)
    if cfg.init_weights:
        init_weights(model)


def init_weights(model: Any) -> None:
    """TransformerLens' ``init_weights`` (``init_mode="gpt2"``) on `model`'s parameters."""
    if model.cfg.seed is not None:
        torch.manual_seed(model.cfg.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "W_" in name:  # drawn contiguous (as TransformerLens' are), then copied into
                # the view, whose strides follow the backend's layout
                param.copy_(torch.empty(param.shape, dtype=param.dtype).normal_(
                    std=model.cfg.initializer_range))


class StateDictMixin:
    """``load_state_dict`` of a TransformerLens model's state dict: its parameters are copied
    into the tree's (views of the backend's weights, so the forward reads them); its buffers
    (masks, rotary tables, which mi-core builds itself) are left out."""

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False
                        ) -> Any:
        if assign:
            raise CapabilityError("load_state_dict(assign=True): the tree's parameters are "
                                  "views of the backend's weights; they are copied into")
        kept = {k: v for k, v in state_dict.items() if not k.endswith(BUFFERS)}
        with torch.no_grad():
            return torch.nn.Module.load_state_dict(self, kept, strict=strict)  # type: ignore


__all__ = ["BUFFERS", "StateDictMixin", "adopt", "checkpoint_dir", "complete", "init_weights"]
