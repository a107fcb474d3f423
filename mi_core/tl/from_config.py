"""``HookedTransformer(cfg)``: TransformerLens' randomly initialised model of a
``HookedTransformerConfig``, for the GPT-2 shape tests and toy models use.

mi-core runs checkpoints through its backends, so the config becomes one: a GPT-2 checkpoint
(``config.json`` + zero / unit ``model.safetensors``) in a temporary directory that lives as
long as the model, loaded by the generic backend. The weights are then drawn as
TransformerLens' ``init_weights`` draws them (``init_mode="gpt2"``: every ``W_*`` parameter,
in ``named_parameters`` order, from ``N(0, initializer_range)``, after
``torch.manual_seed(cfg.seed)`` when a seed is set; norms 1, biases 0), so the same seed gives
TransformerLens' weights; ``model.load_state_dict(tl_model.state_dict())`` copies another
model's. Configs no GPT-2 checkpoint can hold (RMS or no norms, rotary or no positions, gated
or no MLPs, grouped-query attention, ``d_head * n_heads != d_model``, parallel blocks, other
init modes) are refused with a :class:`mi_core.CapabilityError` naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from mi_core import CapabilityError

#: TransformerLens' activation names a GPT-2 checkpoint's ``activation_function`` takes
_ACTS = {"gelu_new": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu",
         "gelu_fast": "gelu_fast", "gelu_pytorch_tanh": "gelu_pytorch_tanh"}
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


def _refusals(cfg: Any) -> list[str]:
    checks = {
        "normalization_type": (cfg.normalization_type, "LN"),
        "positional_embedding_type": (cfg.positional_embedding_type, "standard"),
        "attn_only": (cfg.attn_only, False), "gated_mlp": (cfg.gated_mlp, False),
        "parallel_attn_mlp": (cfg.parallel_attn_mlp, False),
        "n_key_value_heads": (cfg.n_key_value_heads, None),
        "attention_dir": (cfg.attention_dir, "causal"), "init_mode": (cfg.init_mode, "gpt2"),
        "d_vocab_out": (cfg.d_vocab_out, cfg.d_vocab),
        "use_local_attn": (cfg.use_local_attn, False),
        "scale_attn_by_inverse_layer_idx": (cfg.scale_attn_by_inverse_layer_idx, False),
    }
    out = [f"{k}={v!r} (needs {want!r})" for k, (v, want) in checks.items() if v != want]
    if cfg.act_fn not in _ACTS:
        out.append(f"act_fn={cfg.act_fn!r} (one of {sorted(_ACTS)})")
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        out.append(f"d_head * n_heads = {cfg.d_head * cfg.n_heads} != d_model = {cfg.d_model}")
    return out


def checkpoint_dir(cfg: Any) -> Path:
    """A temporary GPT-2 checkpoint of `cfg` (completed): norm gains 2 (a gain of 1 everywhere
    reads as folded norms, ``LNPre``, and the tree would have no ``ln.w`` / ``ln.b``; set to
    1 by :func:`adopt`), every other tensor 0."""
    from safetensors.torch import save_file

    bad = _refusals(cfg)
    if bad:
        raise CapabilityError(
            "HookedTransformer(cfg): mi-core builds a random model as a GPT-2 checkpoint, which "
            "cannot hold " + "; ".join(bad) + " (load a checkpoint with from_pretrained)")
    d, v, f = cfg.d_model, cfg.d_vocab, cfg.d_mlp
    hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": d,
          "n_head": cfg.n_heads, "n_layer": cfg.n_layers, "n_positions": cfg.n_ctx,
          "n_inner": f, "vocab_size": v, "activation_function": _ACTS[cfg.act_fn],
          "layer_norm_epsilon": cfg.eps, "tie_word_embeddings": False,
          "scale_attn_weights": cfg.use_attn_scale, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
          "attn_pdrop": 0.0}
    z = torch.zeros

    def two(n: int) -> torch.Tensor:
        return torch.full((n,), 2.0)

    w = {"transformer.wte.weight": z(v, d), "transformer.wpe.weight": z(cfg.n_ctx, d),
         "transformer.ln_f.weight": two(d), "transformer.ln_f.bias": z(d),
         "lm_head.weight": z(v, d)}
    for i in range(cfg.n_layers):
        p = f"transformer.h.{i}."
        w.update({p + "ln_1.weight": two(d), p + "ln_1.bias": z(d),
                  p + "ln_2.weight": two(d), p + "ln_2.bias": z(d),
                  p + "attn.c_attn.weight": z(d, 3 * d), p + "attn.c_attn.bias": z(3 * d),
                  p + "attn.c_proj.weight": z(d, d), p + "attn.c_proj.bias": z(d),
                  p + "mlp.c_fc.weight": z(d, f), p + "mlp.c_fc.bias": z(f),
                  p + "mlp.c_proj.weight": z(f, d), p + "mlp.c_proj.bias": z(d)})
    out = Path(tempfile.mkdtemp(prefix="mi-tl-cfg-model-"))
    try:
        (out / "config.json").write_text(json.dumps(hf, indent=1))
        save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
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
