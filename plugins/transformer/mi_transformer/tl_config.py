"""The checkpoint that expresses a TransformerLens ``HookedTransformerConfig``, for
``mi_core.tl.HookedTransformer(cfg)`` (the ``mi_checkpoint_from_config`` hook).

mi-core runs checkpoints through backends, so a random TransformerLens model is built on a
checkpoint of its config; which format can hold it is this plugin's knowledge, not the core's.
A GPT-2 checkpoint holds TransformerLens' default shape: LayerNorm, learned positions, a
plain MLP in every block, multi-head attention with ``d_head * n_heads == d_model``.
Every other config is refused with a :class:`CapabilityError` naming the fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mi_core.plugin import CapabilityError

#: TransformerLens' activation names a GPT-2 checkpoint's ``activation_function`` takes
ACTS = {"gelu_new": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu",
        "gelu_fast": "gelu_fast", "gelu_pytorch_tanh": "gelu_pytorch_tanh"}


def refusals(cfg: Any) -> list[str]:
    """The fields of `cfg` (a completed ``HookedTransformerConfig``) a GPT-2 checkpoint cannot
    hold, each as ``field=value (needs ...)``; empty when it can."""
    checks = {
        "normalization_type": (cfg.normalization_type, "LN"),
        "positional_embedding_type": (cfg.positional_embedding_type, "standard"),
        "attn_only": (cfg.attn_only, False), "gated_mlp": (cfg.gated_mlp, False),
        "parallel_attn_mlp": (cfg.parallel_attn_mlp, False),
        "n_key_value_heads": (cfg.n_key_value_heads, None),
        "attention_dir": (cfg.attention_dir, "causal"),
        "d_vocab_out": (cfg.d_vocab_out, cfg.d_vocab),
        "use_local_attn": (cfg.use_local_attn, False),
        "scale_attn_by_inverse_layer_idx": (cfg.scale_attn_by_inverse_layer_idx, False),
    }
    out = [f"{k}={v!r} (needs {want!r})" for k, (v, want) in checks.items() if v != want]
    if cfg.act_fn not in ACTS:
        out.append(f"act_fn={cfg.act_fn!r} (one of {sorted(ACTS)})")
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        out.append(f"d_head * n_heads = {cfg.d_head * cfg.n_heads} != d_model = {cfg.d_model}")
    return out


def write_checkpoint(config: Any, directory: Path, norm_gain: float) -> bool | None:
    """Write `config` (a completed ``HookedTransformerConfig``, known by its class name: this
    plugin does not import the TransformerLens layer) into `directory` as a GPT-2 checkpoint
    (``config.json`` + ``model.safetensors``): norm gains `norm_gain`, every other tensor 0.
    None for any other config (another plugin may express it); a :class:`CapabilityError`
    naming the fields a GPT-2 checkpoint cannot hold."""
    from safetensors.torch import save_file

    if type(config).__name__ != "HookedTransformerConfig":
        return None
    bad = refusals(config)
    if bad:
        raise CapabilityError(
            "HookedTransformer(cfg): mi-transformer builds a random model as a GPT-2 "
            "checkpoint, which cannot hold " + "; ".join(bad)
            + " (load a checkpoint with from_pretrained)")
    cfg = config
    d, v, f = cfg.d_model, cfg.d_vocab, cfg.d_mlp
    hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": d,
          "n_head": cfg.n_heads, "n_layer": cfg.n_layers, "n_positions": cfg.n_ctx,
          "n_inner": f, "vocab_size": v, "activation_function": ACTS[cfg.act_fn],
          "layer_norm_epsilon": cfg.eps, "tie_word_embeddings": False,
          "scale_attn_weights": cfg.use_attn_scale, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
          "attn_pdrop": 0.0}
    z = torch.zeros

    def gain(n: int) -> torch.Tensor:
        return torch.full((n,), float(norm_gain))

    w = {"transformer.wte.weight": z(v, d), "transformer.wpe.weight": z(cfg.n_ctx, d),
         "transformer.ln_f.weight": gain(d), "transformer.ln_f.bias": z(d),
         "lm_head.weight": z(v, d)}
    for i in range(cfg.n_layers):
        p = f"transformer.h.{i}."
        w.update({p + "ln_1.weight": gain(d), p + "ln_1.bias": z(d),
                  p + "ln_2.weight": gain(d), p + "ln_2.bias": z(d),
                  p + "attn.c_attn.weight": z(d, 3 * d), p + "attn.c_attn.bias": z(3 * d),
                  p + "attn.c_proj.weight": z(d, d), p + "attn.c_proj.bias": z(d),
                  p + "mlp.c_fc.weight": z(d, f), p + "mlp.c_fc.bias": z(f),
                  p + "mlp.c_proj.weight": z(f, d), p + "mlp.c_proj.bias": z(d)})
    directory = Path(directory)
    (directory / "config.json").write_text(json.dumps(hf, indent=1))
    save_file(w, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return True
