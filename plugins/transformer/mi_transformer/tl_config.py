"""The checkpoint that expresses a TransformerLens ``HookedTransformerConfig``, for
``mi_core.tl.HookedTransformer(cfg)`` (the ``mi_checkpoint_from_config`` hook).

mi-core runs checkpoints through backends, so a random TransformerLens model is built on a
checkpoint of its config; which format can hold it is this plugin's knowledge, not the core's.
Each shape goes to the family whose arithmetic is TransformerLens' for it, exactly:

- learned positions (``"standard"``), LayerNorm (``"LN"``, or ``"LNPre"``: gains 1, biases
  0), a plain MLP, multi-head attention with ``d_head * n_heads == d_model``: GPT-2;
- rotary positions, RMS norms (``"RMS"`` / ``"RMSPre"``), a gated MLP, multi-head or
  grouped-query attention: LLaMA with ``attention_bias`` (TransformerLens' ``b_Q`` ... ``b_O``;
  no MLP biases: its ``b_in`` is added after the gate's product, which no family does), or
  Helium where ``rotary_adjacent_pairs`` (GPT-J's interleaved pairs);
- rotary positions, LayerNorm, a plain MLP: StarCoder2 (biases everywhere, grouped-query
  attention, ``head_dim`` free).

``rotary_dim < d_head`` is ``partial_rotary_factor``, ``rotary_base`` the RoPE theta. Every
other config is refused with a :class:`CapabilityError` naming the fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch

from mi_core.plugin import CapabilityError

#: TransformerLens' activation names -> the checkpoints' (the same function in both)
ACTS = {"gelu_new": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu",
        "gelu_fast": "gelu_fast", "gelu_pytorch_tanh": "gelu_pytorch_tanh"}
#: architectures whose forward TransformerLens changes (post-norm blocks, full-width q/k norms)
ARCH_FORWARD = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")
#: fields no checkpoint written here holds at another value: field -> the value it must have
NEUTRAL: dict[str, Any] = {
    "attn_only": False, "attention_dir": "causal", "use_local_attn": False,
    "final_rms": False, "use_qk_norm": False, "clip_qkv": None, "use_logn_attn": False,
    "use_dynamic_ntk_rope": False, "rotary_scaling_factor": 1.0,
    "use_NTK_by_parts_rope": False, "use_yarn_rope": False, "attn_scores_soft_cap": -1.0,
    "output_logits_soft_cap": -1.0, "use_normalization_before_and_after": False,
    "use_attention_sinks": False, "post_embedding_ln": False, "num_experts": None,
    "load_in_4bit": False}


def _shared_refusals(cfg: Any) -> list[str]:
    """The fields of `cfg` no family here can hold, each as ``field=value (needs ...)``."""
    out = [f"{k}={getattr(cfg, k, v)!r} (needs {v!r})" for k, v in NEUTRAL.items()
           if getattr(cfg, k, v) != v]
    if cfg.d_vocab_out != cfg.d_vocab:
        out.append(f"d_vocab_out={cfg.d_vocab_out!r} (needs d_vocab = {cfg.d_vocab}: every "
                   f"family's output vocabulary is its input one)")
    if cfg.normalization_type not in ("LN", "LNPre", "RMS", "RMSPre"):
        out.append(f"normalization_type={cfg.normalization_type!r} (one of 'LN', 'LNPre', "
                   f"'RMS', 'RMSPre': no family runs blocks without norms)")
    if cfg.positional_embedding_type not in ("standard", "rotary"):
        out.append(f"positional_embedding_type={cfg.positional_embedding_type!r} (needs "
                   f"'standard' or 'rotary')")
    if cfg.act_fn not in ACTS:
        out.append(f"act_fn={cfg.act_fn!r} (one of {sorted(ACTS)})")
    if getattr(cfg, "original_architecture", None) in ARCH_FORWARD:
        out.append(f"original_architecture={cfg.original_architecture!r} (TransformerLens "
                   f"changes the forward for it)")
    if cfg.use_attn_scale and abs(cfg.attn_scale - cfg.d_head ** 0.5) > 1e-9 * cfg.attn_scale:
        out.append(f"attn_scale={cfg.attn_scale!r} (needs sqrt(d_head) = {cfg.d_head ** 0.5})")
    if cfg.n_key_value_heads is not None and cfg.n_key_value_heads == cfg.n_heads:
        out.append(f"n_key_value_heads={cfg.n_key_value_heads!r} (needs None for multi-head "
                   f"attention, or fewer heads than n_heads)")
    return out


def _family(cfg: Any) -> tuple[str, list[str]]:
    """(the family that holds `cfg`'s shape, the fields it cannot hold: empty when it can)."""
    norm, gated = cfg.normalization_type, cfg.gated_mlp
    out: list[str] = []
    if cfg.positional_embedding_type == "standard":  # GPT-2, the only learned-position family
        want = {"normalization_type": ("LN", "LNPre"), "gated_mlp": (False,),
                "n_key_value_heads": (None,), "parallel_attn_mlp": (False,)}
        out = [f"{k}={getattr(cfg, k)!r} with learned positions (needs "
               f"{' or '.join(map(repr, v))})" for k, v in want.items()
               if getattr(cfg, k) not in v]
        if cfg.d_head * cfg.n_heads != cfg.d_model:
            out.append(f"d_head * n_heads = {cfg.d_head * cfg.n_heads} != d_model = "
                       f"{cfg.d_model} with learned positions")
        return "gpt2", out
    for k, v in (("parallel_attn_mlp", False), ("scale_attn_by_inverse_layer_idx", False),
                 ("use_attn_scale", True)):
        if getattr(cfg, k) != v:
            out.append(f"{k}={getattr(cfg, k)!r} with rotary positions (needs {v!r})")
    if cfg.rotary_dim is not None and not (2 <= cfg.rotary_dim <= cfg.d_head
                                           and cfg.rotary_dim % 2 == 0):
        out.append(f"rotary_dim={cfg.rotary_dim!r} (an even number from 2 to d_head)")
    if str(norm).startswith("RMS"):
        if not gated:
            out.append("gated_mlp=False with RMS norms and rotary positions (needs True)")
        return ("helium" if cfg.rotary_adjacent_pairs else "llama"), out
    if gated:
        out.append("gated_mlp=True with LayerNorm and rotary positions (needs False)")
    if cfg.rotary_adjacent_pairs:
        out.append("rotary_adjacent_pairs=True with LayerNorm (needs False)")
    return "starcoder2", out


def refusals(cfg: Any) -> list[str]:
    """The fields of `cfg` (a completed ``HookedTransformerConfig``) no checkpoint written
    here can hold, each as ``field=value (needs ...)``; empty when one can."""
    return _shared_refusals(cfg) + _family(cfg)[1]


Tensors = dict[str, torch.Tensor]


def _gpt2(cfg: Any, gain: Callable[[int], torch.Tensor]) -> tuple[dict[str, Any], Tensors]:
    d, v, f, z = cfg.d_model, cfg.d_vocab, cfg.d_mlp, torch.zeros
    hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": d,
          "n_head": cfg.n_heads, "n_layer": cfg.n_layers, "n_positions": cfg.n_ctx,
          "n_inner": f, "vocab_size": v, "activation_function": ACTS[cfg.act_fn],
          "layer_norm_epsilon": cfg.eps, "tie_word_embeddings": False,
          "scale_attn_weights": cfg.use_attn_scale,
          "scale_attn_by_inverse_layer_idx": cfg.scale_attn_by_inverse_layer_idx,
          "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
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
    return hf, w


def _rotary(cfg: Any, family: str, gain: Callable[[int], torch.Tensor]
            ) -> tuple[dict[str, Any], Tensors]:
    """LLaMA / Helium (RMS, gated) or StarCoder2 (LayerNorm, plain MLP): separate q/k/v/o
    projections with biases, ``head_dim`` and the KV heads free."""
    d, v, f, z = cfg.d_model, cfg.d_vocab, cfg.d_mlp, torch.zeros
    h, kv, dh = cfg.n_heads, cfg.n_key_value_heads or cfg.n_heads, cfg.d_head
    rot = cfg.rotary_dim or dh
    hf = {"model_type": family, "hidden_size": d, "num_attention_heads": h,
          "num_key_value_heads": kv, "head_dim": dh, "num_hidden_layers": cfg.n_layers,
          "intermediate_size": f, "vocab_size": v, "hidden_act": ACTS[cfg.act_fn],
          "max_position_embeddings": cfg.n_ctx, "rope_theta": float(cfg.rotary_base),
          "tie_word_embeddings": False}
    if rot != dh:
        hf["partial_rotary_factor"] = rot / dh
        if int(dh * hf["partial_rotary_factor"]) != rot:  # transformers truncates d * frac
            raise CapabilityError(f"HookedTransformer(cfg): rotary_dim={rot} is not "
                                  f"int(d_head * partial_rotary_factor) for any factor")
    plain = family == "starcoder2"
    if plain:
        hf.update(norm_epsilon=cfg.eps, use_bias=True, sliding_window=None)
    else:
        hf.update(rms_norm_eps=cfg.eps, attention_bias=True, mlp_bias=False)

    def norm(name: str) -> Tensors:
        return {name + ".weight": gain(d), **({name + ".bias": z(d)} if plain else {})}

    w = {"model.embed_tokens.weight": z(v, d), **norm("model.norm"), "lm_head.weight": z(v, d)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        w.update({**norm(p + "input_layernorm"), **norm(p + "post_attention_layernorm")})
        for name, rows in (("q", h * dh), ("k", kv * dh), ("v", kv * dh), ("o", d)):
            w[f"{p}self_attn.{name}_proj.weight"] = z(rows, d if name != "o" else h * dh)
            w[f"{p}self_attn.{name}_proj.bias"] = z(rows)
        if plain:
            w.update({p + "mlp.c_fc.weight": z(f, d), p + "mlp.c_fc.bias": z(f),
                      p + "mlp.c_proj.weight": z(d, f), p + "mlp.c_proj.bias": z(d)})
        else:
            w.update({p + "mlp.gate_proj.weight": z(f, d), p + "mlp.up_proj.weight": z(f, d),
                      p + "mlp.down_proj.weight": z(d, f)})
    return hf, w


def write_checkpoint(config: Any, directory: Path, norm_gain: float) -> bool | None:
    """Write `config` (a completed ``HookedTransformerConfig``, known by its class name: this
    plugin does not import the TransformerLens layer) into `directory` as a checkpoint of the
    family that holds its shape (``config.json`` + ``model.safetensors``): norm gains
    `norm_gain` (1 for ``LNPre`` / ``RMSPre``, whose norms have no gain), every other tensor
    0. None for any other config (another plugin may express it); a :class:`CapabilityError`
    naming the fields no family here can hold."""
    from safetensors.torch import save_file

    if type(config).__name__ != "HookedTransformerConfig":
        return None
    bad = refusals(config)
    if bad:
        raise CapabilityError(
            "HookedTransformer(cfg): mi-transformer builds a random model as a checkpoint of a "
            "family (GPT-2; LLaMA / Helium; StarCoder2) that holds its shape, and none holds "
            + "; ".join(bad) + " (load a checkpoint with from_pretrained)")
    folded = str(config.normalization_type).endswith("Pre")
    value = 1.0 if folded else float(norm_gain)

    def gain(n: int) -> torch.Tensor:
        return torch.full((n,), value)

    family = _family(config)[0]
    hf, w = _gpt2(config, gain) if family == "gpt2" else _rotary(config, family, gain)
    directory = Path(directory)
    (directory / "config.json").write_text(json.dumps(hf, indent=1))
    save_file(w, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return True
