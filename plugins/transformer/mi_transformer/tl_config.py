"""The checkpoint that expresses a TransformerLens ``HookedTransformerConfig``, for
``mi_core.tl.HookedTransformer(cfg)`` (the ``mi_checkpoint_from_config`` hook).

mi-core runs checkpoints through backends, so a random TransformerLens model is built on a
checkpoint of its config; which format can hold it is this plugin's knowledge, not the core's.
The checkpoint is the plugin-internal family ``mi_tl_hooked_transformer``
(:mod:`mi_transformer.config.families_tl`): its ``config.json`` holds TransformerLens' own
fields, its tensors LLaMA's names with ``model.embed_positions`` (``W_pos``) and
``lm_head.bias`` (``b_U``). It holds learned or rotary positions, LayerNorm or RMS norms (the
``Pre`` kinds as gains 1, biases 0), plain, gated or no MLP (``attn_only``), multi-head or
grouped-query attention, biases on q/k/v/o, a plain MLP and the unembedding (a gated MLP has
none: TransformerLens adds its ``b_in`` after the gate's product). Every other config is
refused with a :class:`CapabilityError` naming the fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch

from mi_core.plugin import CapabilityError

from mi_transformer.config.families_tl import MODEL_TYPE, READS

#: TransformerLens' activation names -> the backend's (the same function in both)
ACTS = {"gelu_new": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu",
        "gelu_fast": "gelu_fast", "gelu_pytorch_tanh": "gelu_pytorch_tanh"}
#: architectures whose forward TransformerLens changes (post-norm blocks, full-width q/k norms)
ARCH_FORWARD = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")
#: fields no checkpoint written here holds at another value: field -> the value it must have
NEUTRAL: dict[str, Any] = {
    "attention_dir": "causal", "use_local_attn": False,
    "final_rms": False, "use_qk_norm": False, "clip_qkv": None, "use_logn_attn": False,
    "use_dynamic_ntk_rope": False, "rotary_scaling_factor": 1.0,
    "use_NTK_by_parts_rope": False, "use_yarn_rope": False, "attn_scores_soft_cap": -1.0,
    "output_logits_soft_cap": -1.0, "use_normalization_before_and_after": False,
    "use_attention_sinks": False, "post_embedding_ln": False, "num_experts": None,
    "load_in_4bit": False}


def _shared_refusals(cfg: Any) -> list[str]:
    """The fields of `cfg` the checkpoint cannot hold, each as ``field=value (needs ...)``."""
    out = [f"{k}={getattr(cfg, k, v)!r} (needs {v!r})" for k, v in NEUTRAL.items()
           if getattr(cfg, k, v) != v]
    if cfg.d_vocab_out != cfg.d_vocab:
        out.append(f"d_vocab_out={cfg.d_vocab_out!r} (needs d_vocab = {cfg.d_vocab}: the "
                   f"head's rows are the input vocabulary)")
    if cfg.normalization_type not in ("LN", "LNPre", "RMS", "RMSPre"):
        out.append(f"normalization_type={cfg.normalization_type!r} (one of 'LN', 'LNPre', "
                   f"'RMS', 'RMSPre': the backend has no identity norm)")
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


def _shape_refusals(cfg: Any) -> list[str]:
    """The shape fields of `cfg` the checkpoint cannot hold, each as ``field=value (needs
    ...)``."""
    out = []
    if cfg.parallel_attn_mlp:
        out.append("parallel_attn_mlp=True (needs False: blocks run attention, then the MLP)")
    if cfg.positional_embedding_type == "rotary" and cfg.rotary_dim is not None and not (
            2 <= cfg.rotary_dim <= cfg.d_head and cfg.rotary_dim % 2 == 0):
        out.append(f"rotary_dim={cfg.rotary_dim!r} (an even number from 2 to d_head)")
    return out


def refusals(cfg: Any) -> list[str]:
    """The fields of `cfg` (a completed ``HookedTransformerConfig``) no checkpoint written
    here can hold, each as ``field=value (needs ...)``; empty when one can."""
    return _shared_refusals(cfg) + _shape_refusals(cfg)


Tensors = dict[str, torch.Tensor]
#: the config fields the checkpoint's config.json holds (TransformerLens' names; the
#: plugin-internal family config/families_tl.py reads exactly these)
FIELDS = tuple(sorted(READS))


def _tensors(cfg: Any, gain: Callable[[int], torch.Tensor]) -> Tensors:
    """The checkpoint's tensors (LLaMA's names, name_tables ``mi_tl_hooked_transformer``):
    norm gains `gain`, every other tensor 0; biases on q/k/v/o, a plain MLP and the
    unembedding (TransformerLens' ``b_U``); no MLP (nor its norm) with ``attn_only``."""
    d, v, z = cfg.d_model, cfg.d_vocab, torch.zeros
    h, kv, dh = cfg.n_heads, cfg.n_key_value_heads or cfg.n_heads, cfg.d_head
    layer_norm = str(cfg.normalization_type).startswith("LN")

    def norm(name: str) -> Tensors:
        return {name + ".weight": gain(d), **({name + ".bias": z(d)} if layer_norm else {})}

    w = {"model.embed_tokens.weight": z(v, d), **norm("model.norm"),
         "lm_head.weight": z(v, d), "lm_head.bias": z(v)}
    if cfg.positional_embedding_type == "standard":
        w["model.embed_positions.weight"] = z(cfg.n_ctx, d)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        w.update(norm(p + "input_layernorm"))
        for name, rows in (("q", h * dh), ("k", kv * dh), ("v", kv * dh), ("o", d)):
            w[f"{p}self_attn.{name}_proj.weight"] = z(rows, d if name != "o" else h * dh)
            w[f"{p}self_attn.{name}_proj.bias"] = z(rows)
        if cfg.attn_only:
            continue
        f = cfg.d_mlp
        w.update(norm(p + "post_attention_layernorm"))
        w.update({p + "mlp.gate_proj.weight": z(f, d), p + "mlp.down_proj.weight": z(d, f)})
        if cfg.gated_mlp:
            w[p + "mlp.up_proj.weight"] = z(f, d)
        else:
            w.update({p + "mlp.gate_proj.bias": z(f), p + "mlp.down_proj.bias": z(d)})
    return w


def write_checkpoint(config: Any, directory: Path, norm_gain: float) -> bool | None:
    """Write `config` (a completed ``HookedTransformerConfig``, known by its class name: this
    plugin does not import the TransformerLens layer) into `directory` as a
    ``mi_tl_hooked_transformer`` checkpoint (``config.json`` + ``model.safetensors``): norm gains
    `norm_gain` (1 for ``LNPre`` / ``RMSPre``, whose norms have no gain), every other tensor
    0. None for any other config (another plugin may express it); a :class:`CapabilityError`
    naming the fields the checkpoint cannot hold."""
    from safetensors.torch import save_file

    if type(config).__name__ != "HookedTransformerConfig":
        return None
    bad = refusals(config)
    if bad:
        raise CapabilityError(
            "HookedTransformer(cfg): mi-transformer builds a random model as a checkpoint "
            "(mi_tl_hooked_transformer), which cannot hold "
            + "; ".join(bad) + " (load a checkpoint with from_pretrained)")
    folded = str(config.normalization_type).endswith("Pre")
    value = 1.0 if folded else float(norm_gain)

    def gain(n: int) -> torch.Tensor:
        return torch.full((n,), value)

    rotary = config.positional_embedding_type == "rotary"  # else no rotary_* key is read
    hf = {"model_type": MODEL_TYPE, **{k: getattr(config, k) for k in FIELDS
                                       if rotary or not k.startswith("rotary_")}}
    if rotary:
        hf["rotary_base"] = float(hf["rotary_base"])
    w = _tensors(config, gain)
    directory = Path(directory)
    (directory / "config.json").write_text(json.dumps(hf, indent=1))
    save_file(w, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return True
