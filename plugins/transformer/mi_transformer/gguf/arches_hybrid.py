"""GGUF architectures of the hybrid families whose mixer layers run mi-ssm's mixers beside
attention: ``granitehybrid`` (Granite 4.0-H and Bamba), ``nemotron_h`` and ``nemotron_h_moe``
(Nemotron 3: its mixture-of-experts layers), and the gated-DeltaNet
hybrids ``qwen3next``, ``qwen35`` and ``qwen35moe``
(:mod:`mi_transformer.config.families_hybrid`, :mod:`~mi_transformer.config.families_linear`).

What llama.cpp's converter (``conversion/granite.py``: ``GraniteHybridModel``;
``conversion/nemotron.py``: ``NemotronHModel``; ``conversion/qwen.py``: ``Qwen3NextModel``,
``Qwen3_5TextModel``, ``Qwen3_5MoeTextModel``) changes, undone here:

- Mamba-2 layers (granitehybrid, nemotron_h) as in ``mamba2``: ``A = -exp(A_log)`` [heads, 1],
  ``D`` [heads, 1], ``dt_bias`` as ``ssm_dt.bias``, the conv squeezed, the gated norm
  [groups, d_inner / groups]. Which layers attend is the per-layer ``attention.head_count_kv``
  (0 on Mamba layers); Nemotron-H's MLP-only layers are those with a non-zero per-layer
  ``feed_forward_length``. The ``ssm.*`` keys give the mixer: ``time_step_rank`` is the head
  count, ``inner_size`` the heads' total width.
- Attention q / k rows permuted as LLaMA's (``LlamaModel.permute`` over the whole head, even
  where only part of it rotates, and without positions at all): unpermuted.
- granitehybrid: the fused expert ``input_linear`` [E, 2 f, d] and shared / dense
  ``shared_mlp.input_linear`` [2 f, d] split into gate and up halves (joined again); the
  multipliers as ``attention.scale``, ``embedding_scale``, ``residual_scale``,
  ``logit_scale``; RoPE on or off as ``rope.scaling.finetuned`` (llama.cpp's switch: absent
  means on). The converter sets it for Bamba and leaves it off for every Granite 4.0-H with
  Mamba layers, whatever ``position_embedding_type`` said: the GGUF of a Granite 4.0-H saved
  with RoPE runs without it, in llama.cpp and here. A file without multipliers or experts,
  with RoPE on half of each head (Bamba's ``attn_rotary_emb``), is Bamba; any other is
  ``granitemoehybrid`` (a missing ``attention.scale`` is llama.cpp's 1 / sqrt(head_dim)).
- Nemotron-H: the layer norm's epsilon as ``attention.layer_norm_epsilon`` (its
  ``layer_norm_epsilon``); its dt floor ``time_step_min`` is not written (transformers'
  default 0.001, the published value, is taken; llama.cpp does not clamp dt).
- qwen3next / qwen35 / qwen35moe: every (1 + w) RMS norm stored as 1 + w (the gated norm
  ``ssm_norm`` excepted), ``A = -exp(A_log)``, ``dt_bias`` as ``ssm_dt.bias``, the conv
  squeezed; Qwen3-Next's ``in_proj_qkvz`` (rows per key head [q, k, v, z]) as ``attn_qkv``
  ([q | k | v] over all heads) and ``attn_gate`` (z) or, in older files, whole as ``ssm_in``;
  Qwen3.5's value heads reordered from grouped by key head to tiled
  (``_LinearAttentionVReorderBase``: the v rows of ``attn_qkv`` and of the conv, ``attn_gate``,
  ``ssm_beta`` / ``ssm_alpha``, ``ssm_a``, ``ssm_dt``, the columns of ``ssm_out``). The
  linear-attention sizes are ``ssm.*`` (state size = key head dim, group count = key heads,
  time-step rank = value heads, inner size = value heads x value head dim); the schedule
  ``attention.recurrent_layers`` or every ``full_attention_interval``-th layer attending
  (default 4, llama.cpp's rule), checked against the tensors present. Qwen3.5's M-RoPE
  sections (``rope.dimension_sections``) cannot change a text-only forward: checked, not used.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from mi_core.plugin import ConfigError, UnsupportedModelError

from mi_transformer.gguf.arches import _MOE_SLOTS, GgufArch, Join, _Meta
from mi_transformer.gguf.arches_ssm import _a_log, _column, _conv, _flat


def _want(t: torch.Tensor, shape: tuple[int, ...], what: str) -> torch.Tensor:
    if tuple(t.shape) != shape:
        raise ValueError(f"{what} must be {list(shape)}")
    return t


def _embedding(m: _Meta, hidden: int) -> int:
    """The vocabulary: the embedding's rows (the converter pads the token list to a multiple
    of 8 or 16 for the Mamba-2 hybrids)."""
    emb = m.shapes.get("token_embd.weight")
    if emb is None or len(emb) != 2 or emb[1] != hidden:
        raise ConfigError(f"{m.path}: token_embd.weight of shape {emb} does not give the "
                          f"vocabulary of an embedding of width {hidden}")
    return emb[0]


def _per_layer(m: _Meta, key: str, n: int, what: str) -> list[int]:
    """``{arch}.<key>``: `n` non-negative integers (one per layer) with one non-zero value,
    or one integer for every layer."""
    k = f"{m.arch}.{key}"
    v = m.raw(k)
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        v = [v] * n
    if not (isinstance(v, list) and len(v) == n and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
            and len({x for x in v if x}) <= 1):
        raise m._bad(k, v, f"{n} integers, {what}")
    return v


def _ids(m: _Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    """The special token ids of the tokenizer metadata, as :func:`hf_config` adds them."""
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("padding_token_id", "pad_token_id")):
        v = m.int(f"tokenizer.ggml.{key}", None, arch=False, min=0)
        if v is not None:
            cfg[hf] = v
    return cfg


def _mamba2_sizes(m: _Meta) -> dict[str, int]:
    """The Mamba-2 mixer of ``ssm.*``: heads (time-step rank), their width, groups, state,
    conv kernel."""
    inner, heads = m.int("ssm.inner_size"), m.int("ssm.time_step_rank")
    if inner % heads:
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.ssm.time_step_rank {heads} (the "
                          f"heads) does not divide ssm.inner_size {inner}")
    return {"inner": inner, "heads": heads, "head_dim": inner // heads,
            "groups": m.int("ssm.group_count", 1), "state": m.int("ssm.state_size"),
            "conv": m.int("ssm.conv_kernel")}


def _first(flags: list[bool]) -> int:
    return next((i for i, f in enumerate(flags) if f), 0)


# ----------------------------------------------------------------------------------------
# granitehybrid: Granite 4.0-H and Bamba
# ----------------------------------------------------------------------------------------

_GRANITE_SCALES = {"attention.scale": "attention_multiplier",
                   "embedding_scale": "embedding_multiplier",
                   "residual_scale": "residual_multiplier", "logit_scale": "logits_scaling"}


def _granitehybrid(m: _Meta, names: set[str]) -> dict[str, Any]:
    """Bamba or GraniteMoeHybrid (see the module docstring for which)."""
    n, hidden = m.int("block_count"), m.int("embedding_length")
    heads = m.int("attention.head_count")
    kv = _per_layer(m, "attention.head_count_kv", n, "the KV heads of the attention layers "
                    "(one value) and 0 for the Mamba ones")
    attn = [x > 0 for x in kv]
    if not any(attn):
        raise UnsupportedModelError(f"{m.path}: granitehybrid without attention layers "
                                    f"({m.arch}.attention.head_count_kv all 0) is not supported")
    head_dim = m.int("attention.key_length", hidden // heads)
    rot = m.int("rope.dimension_count", head_dim)
    rope = m.bool("rope.scaling.finetuned", True)  # llama.cpp: absent means RoPE on
    s = _mamba2_sizes(m)
    if s["inner"] % hidden:
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.ssm.inner_size {s['inner']} is not "
                          f"a multiple of {m.arch}.embedding_length {hidden}")
    experts = [f"blk.{i}.ffn_gate_inp.weight" in names for i in range(n)]
    if any(experts) and not all(experts):
        raise UnsupportedModelError(f"{m.path}: granitehybrid with experts on some layers only "
                                    f"({[i for i, e in enumerate(experts) if e]}) is not a "
                                    f"Granite 4.0-H layout")
    scales = {hf: m.float(key, None) for key, hf in _GRANITE_SCALES.items()}
    ssm, att = _first([not a for a in attn]), _first(attn)
    cfg: dict[str, Any] = {
        "vocab_size": _embedding(m, hidden), "hidden_size": hidden, "num_hidden_layers": n,
        "num_attention_heads": heads, "num_key_value_heads": max(kv), "head_dim": head_dim,
        "hidden_act": "silu", "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": m.float("rope.freq_base", 10000.0),
        "max_position_embeddings": m.int("context_length", 2048),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": f"blk.{att}.attn_q.bias" in names,
        "mamba_n_heads": s["heads"], "mamba_d_head": s["head_dim"],
        "mamba_n_groups": s["groups"], "mamba_d_state": s["state"], "mamba_d_conv": s["conv"],
        "mamba_expand": s["inner"] // hidden,
        "mamba_conv_bias": f"blk.{ssm}.ssm_conv1d.bias" in names,
        "mamba_proj_bias": f"blk.{ssm}.ssm_in.bias" in names, "torch_dtype": "float32"}
    bamba = rope and not any(experts) and 2 * rot == head_dim and \
        all(v is None for v in scales.values())
    if bamba:  # transformers' Bamba rotates half of each head, always
        return _ids(m, dict(cfg, model_type="bamba", architectures=["BambaForCausalLM"],
                            intermediate_size=m.int("feed_forward_length", allow_list=True),
                            mlp_bias="blk.0.ffn_up.bias" in names,
                            attn_layer_indices=[i for i, a in enumerate(attn) if a]))
    shared = m.int("expert_shared_feed_forward_length", None) or m.rows("blk.0.ffn_up.weight")
    if shared is None:
        raise ConfigError(f"{m.path}: GGUF metadata lacks required key "
                          f"'{m.arch}.expert_shared_feed_forward_length'")
    if scales["attention_multiplier"] is None:  # llama.cpp's kq_scale without the key
        scales["attention_multiplier"] = 1.0 / math.sqrt(head_dim)
    cfg.update(model_type="granitemoehybrid", architectures=["GraniteMoeHybridForCausalLM"],
               intermediate_size=m.int("feed_forward_length", shared, allow_list=True),
               shared_intermediate_size=shared,
               num_local_experts=m.int("expert_count") if any(experts) else 0,
               num_experts_per_tok=m.int("expert_used_count", 1),
               layer_types=["attention" if a else "mamba" for a in attn],
               position_embedding_type="rope" if rope else "nope",
               **{k: 1.0 if v is None else v for k, v in scales.items()})
    if rope and rot != head_dim:
        cfg["partial_rotary_factor"] = rot / head_dim
    return _ids(m, cfg)


def _halves(family: Any, parts: list[torch.Tensor]) -> torch.Tensor:
    """gate, up -> [gate | up] along the rows: the experts' ``input_linear`` [E, 2 f, d] or
    the shared / dense MLP's [2 f, d] (the inverse of ``GraniteMoeModel.modify_tensors``)."""
    gate, up = parts
    if gate.shape != up.shape or gate.dim() not in (2, 3):
        raise ValueError(f"gate and up must have one shape (got {list(gate.shape)} and "
                         f"{list(up.shape)})")
    return torch.cat([gate, up], dim=gate.dim() - 2)


_MAMBA2 = {"attn_norm": "ln1", "ffn_norm": "ln2", "ssm_in": "mixer:in_proj",
           "ssm_conv1d": "mixer:conv1d", "ssm_a": "mixer:A_log", "ssm_d": "mixer:D",
           "ssm_dt.bias": "mixer:dt_bias", "ssm_norm": "mixer:norm", "ssm_out": "mixer:out_proj",
           "attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o"}
_MAMBA2_CONVERT = {"ssm_a": _a_log, "ssm_d": _column, "ssm_conv1d.weight": _conv,
                   "ssm_norm.weight": _flat}

_GRANITE_MOE = {"ffn_gate_inp": "moe:{block}.{router}",
                "ffn_gate_exps.weight": "join:moe:{block}.input_linear.weight",
                "ffn_up_exps.weight": "join:moe:{block}.input_linear.weight",
                "ffn_down_exps.weight": "moe:{block}.output_linear.weight",
                "ffn_gate_shexp.weight": "join:moe:shared_mlp.input_linear.weight",
                "ffn_up_shexp.weight": "join:moe:shared_mlp.input_linear.weight",
                "ffn_down_shexp.weight": "moe:shared_mlp.output_linear.weight"}
_GRANITE_DENSE = {"ffn_gate.weight": "join:gate_up.weight", "ffn_up.weight": "join:gate_up.weight",
                  "ffn_down": "mlp_out"}


def _granitehybrid_slots(cfg: Mapping[str, Any]) -> Mapping[str, str]:
    if cfg["model_type"] == "bamba":
        return {**_MAMBA2, "ffn_gate": "mlp_in", "ffn_up": "mlp_up", "ffn_down": "mlp_out"}
    return {**_MAMBA2, **(_GRANITE_MOE if cfg["num_local_experts"] else _GRANITE_DENSE)}


# ----------------------------------------------------------------------------------------
# nemotron_h
# ----------------------------------------------------------------------------------------

def _nemotron_h(m: _Meta, names: set[str]) -> dict[str, Any]:
    """Nemotron-H: each layer Mamba-2, attention (KV heads > 0) or a squared-ReLU MLP
    (feed-forward length > 0), as ``hybrid_override_pattern``."""
    n, hidden = m.int("block_count"), m.int("embedding_length")
    kv = _per_layer(m, "attention.head_count_kv", n, "the KV heads of the attention layers "
                    "(one value) and 0 elsewhere")
    ff = _per_layer(m, "feed_forward_length", n, "the MLP width of the MLP layers (one "
                    "value) and 0 elsewhere")
    both = [i for i in range(n) if kv[i] and ff[i]]
    if both:
        raise ConfigError(f"{m.path}: layers {both} have both KV heads and an MLP width; a "
                          f"Nemotron-H layer is one of Mamba-2, attention or MLP")
    if m.raw(f"{m.arch}.expert_count") and any(f"blk.{i}.ffn_gate_inp.weight" in names
                                               for i in range(n)):
        raise UnsupportedModelError(f"{m.path}: Nemotron-H mixture-of-experts layers in a "
                                    f"nemotron_h file (llama.cpp writes them as "
                                    f"nemotron_h_moe) are not supported")
    pattern = "".join("*" if kv[i] else "-" if ff[i] else "M" for i in range(n))
    heads = m.int("attention.head_count")
    s = _mamba2_sizes(m)
    ssm, att, mlp = pattern.find("M"), max(pattern.find("*"), 0), max(pattern.find("-"), 0)
    eps = m.float("attention.layer_norm_rms_epsilon", None)
    cfg: dict[str, Any] = {
        "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"],
        "vocab_size": _embedding(m, hidden), "hidden_size": hidden, "num_hidden_layers": n,
        "hybrid_override_pattern": pattern, "num_attention_heads": heads,
        "num_key_value_heads": max(kv) or heads,
        "head_dim": m.int("attention.key_length", hidden // heads),
        "intermediate_size": max(ff) or m.rows("blk.0.ffn_up.weight") or 1,
        "mlp_hidden_act": "relu2", "mamba_hidden_act": "silu",
        "mlp_bias": f"blk.{mlp}.ffn_up.bias" in names,
        "layer_norm_epsilon": eps if eps is not None else
        m.float("attention.layer_norm_epsilon", 1e-5),
        "mamba_num_heads": s["heads"], "mamba_head_dim": s["head_dim"],
        "n_groups": s["groups"], "ssm_state_size": s["state"], "conv_kernel": s["conv"],
        "use_conv_bias": ssm >= 0 and f"blk.{ssm}.ssm_conv1d.bias" in names,
        "use_bias": ssm >= 0 and f"blk.{ssm}.ssm_in.bias" in names,
        "time_step_min": 0.001,  # not in the file: transformers' (and the published) value
        "attention_bias": f"blk.{att}.attn_q.bias" in names,
        "tie_word_embeddings": "output.weight" not in names, "torch_dtype": "float32"}
    return _ids(m, cfg)


def _nemotron_moe_pattern(m: _Meta, names: set[str], kv: list[int], ff: list[int]) -> str:
    """The layer pattern (``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` experts) of a
    ``nemotron_h_moe`` file, from the per-layer KV heads and widths, else the tensors."""
    pattern = ""
    for i in range(len(kv)):
        has = {t: f"blk.{i}.{t}.weight" in names for t in ("ssm_in", "ffn_up", "ffn_gate_inp")}
        if kv[i] and ff[i]:
            raise ConfigError(f"{m.path}: layer {i} has both KV heads and a feed-forward "
                              f"length; a Nemotron-H layer is one of Mamba-2, attention, MLP "
                              f"or mixture of experts")
        if ff[i] and not has["ffn_gate_inp"]:
            raise ConfigError(f"{m.path}: layer {i} has feed-forward length {ff[i]} (a "
                              f"mixture-of-experts layer) but no tensor "
                              f"'blk.{i}.ffn_gate_inp.weight'")
        pattern += "*" if kv[i] else "E" if ff[i] else "-" if has["ffn_up"] and \
            not has["ssm_in"] else "M"
    return pattern


def _nemotron_h_moe(m: _Meta, names: set[str]) -> dict[str, Any]:
    """Nemotron 3 (``nemotron_h_moe``): Nemotron-H whose MLP layers are mixtures of experts
    (``E``). The converter writes the experts' width as the per-layer feed-forward length of
    the MoE layers and 0 elsewhere, so its dense MLP layers (``-``, transformers' "mlp") look
    like Mamba-2 layers in the metadata (llama.cpp cannot run such a file): a layer without
    KV heads or feed-forward length is told by its tensors (``ssm_in`` or ``ffn_up``)."""
    n = m.int("block_count") - m.int("nextn_predict_layers", 0, min=0)
    if n < 1:
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.nextn_predict_layers leaves no "
                          f"layer of the {m.int('block_count')} (block_count)")
    hidden, total = m.int("embedding_length"), m.int("block_count")
    kv = _per_layer(m, "attention.head_count_kv", total, "the KV heads of the attention "
                    "layers (one value) and 0 elsewhere")[:n]
    ff = _per_layer(m, "feed_forward_length", total, "the experts' width on the "
                    "mixture-of-experts layers (one value) and 0 elsewhere")[:n]
    pattern = _nemotron_moe_pattern(m, names, kv, ff)
    if "E" not in pattern:
        raise ConfigError(f"{m.path}: {m.arch} without mixture-of-experts layers (no layer has "
                          f"a feed-forward length in {m.arch}.feed_forward_length)")
    heads = m.int("attention.head_count")
    s = _mamba2_sizes(m)
    ssm, att, mlp = pattern.find("M"), max(pattern.find("*"), 0), pattern.find("-")
    eps = m.float("attention.layer_norm_rms_epsilon", None)
    groups = m.int("expert_group_count", 1)
    kept = m.int("expert_group_used_count", None)
    if kept is None and groups > 1:  # llama.cpp routes without the group limit
        raise UnsupportedModelError(
            f"{m.path}: GGUF metadata {m.arch}.expert_group_count = {groups} without "
            f"{m.arch}.expert_group_used_count: how many expert groups are kept is not in the "
            f"file")
    gating = m.int("expert_gating_func", None, min=0)
    if gating not in (None, 2):  # llama.cpp's nemotron_h_moe is always sigmoid (2)
        raise UnsupportedModelError(f"{m.path}: GGUF metadata {m.arch}.expert_gating_func = "
                                    f"{gating}: Nemotron-H routes with sigmoid scores (2)")
    norm = m.raw(f"{m.arch}.expert_weights_norm")
    if norm is not None and not isinstance(norm, bool):
        raise m._bad(f"{m.arch}.expert_weights_norm", norm, "true or false")
    scale = m.raw(f"{m.arch}.expert_weights_scale")  # llama.cpp: absent or 0 = no scaling
    latent = m.int("moe_latent_size", None)
    e = pattern.find("E")
    if (latent is not None) != (f"blk.{e}.ffn_latent_down.weight" in names):
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.moe_latent_size is "
                          f"{'set' if latent else 'absent'} but tensor "
                          f"'blk.{e}.ffn_latent_down.weight' is "
                          f"{'absent' if latent else 'present'}")
    experts = m.int("expert_feed_forward_length", None, allow_list=True) or max(ff)
    cfg: dict[str, Any] = {
        "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"],
        "vocab_size": _embedding(m, hidden), "hidden_size": hidden, "num_hidden_layers": n,
        "hybrid_override_pattern": pattern, "num_attention_heads": heads,
        "num_key_value_heads": max(kv) or heads,
        "head_dim": m.int("attention.key_length", hidden // heads),
        "intermediate_size": (m.rows(f"blk.{mlp}.ffn_up.weight") if mlp >= 0 else None)
        or experts, "mlp_hidden_act": "relu2", "mamba_hidden_act": "silu",
        "mlp_bias": mlp >= 0 and f"blk.{mlp}.ffn_up.bias" in names,
        "layer_norm_epsilon": eps if eps is not None else
        m.float("attention.layer_norm_epsilon", 1e-5),
        "mamba_num_heads": s["heads"], "mamba_head_dim": s["head_dim"],
        "n_groups": s["groups"], "ssm_state_size": s["state"], "conv_kernel": s["conv"],
        "use_conv_bias": ssm >= 0 and f"blk.{ssm}.ssm_conv1d.bias" in names,
        "use_bias": ssm >= 0 and f"blk.{ssm}.ssm_in.bias" in names,
        "time_step_min": 0.001,  # not in the file: transformers' (and the published) value
        "attention_bias": f"blk.{att}.attn_q.bias" in names,
        "tie_word_embeddings": "output.weight" not in names, "torch_dtype": "float32",
        "n_routed_experts": m.int("expert_count"),
        "num_experts_per_tok": m.int("expert_used_count", allow_list=True),
        "moe_intermediate_size": experts,
        "moe_shared_expert_intermediate_size": m.int("expert_shared_feed_forward_length"),
        "norm_topk_prob": bool(norm), "n_group": groups, "topk_group": kept or groups,
        "routed_scaling_factor": 1.0 if scale in (None, 0) else
        m.float("expert_weights_scale")}
    if latent is not None:
        cfg["moe_latent_size"] = latent
    return _ids(m, cfg)


def _nemotron_relabel(family: Any, layer: int | None, slot: str) -> str:
    """An MLP-only layer's one norm is its ``ln2`` (llama.cpp calls every layer's
    ``attn_norm``)."""
    from mi_transformer.config.axes import MLP_ONLY

    if layer is not None and slot == "ln1.weight" and family.layer_mixers and \
            family.layer_mixers[layer] == MLP_ONLY:
        return "ln2.weight"
    return slot


# ----------------------------------------------------------------------------------------
# qwen3next, qwen35, qwen35moe
# ----------------------------------------------------------------------------------------

def _delta_schedule(m: _Meta, n: int, names: set[str]) -> list[str]:
    """``layer_types``: ``attention.recurrent_layers`` (true: linear attention) or llama.cpp's
    every ``full_attention_interval``-th layer attending; the attention layers must be the
    ones with attention tensors."""
    key = f"{m.arch}.attention.recurrent_layers"
    rec = m.raw(key)
    if rec is not None:
        if isinstance(rec, bool):
            rec = [rec] * n
        if not (isinstance(rec, list) and len(rec) >= n and all(isinstance(x, bool)
                                                                for x in rec)):
            raise m._bad(key, rec, f"{n} booleans (true: a linear-attention layer)")
        rec = rec[:n]
    else:
        every = m.int("full_attention_interval", 4)
        rec = [(i + 1) % every != 0 for i in range(n)]
    have = [f"blk.{i}.attn_q.weight" in names for i in range(n)]
    if have != [not r for r in rec]:
        raise ConfigError(f"{m.path}: the attention layers of the GGUF metadata "
                          f"({[i for i, r in enumerate(rec) if not r]}) are not the layers "
                          f"with attention tensors ({[i for i, h in enumerate(have) if h]})")
    return ["linear_attention" if r else "full_attention" for r in rec]


def _gated_delta(m: _Meta, names: set[str], model_type: str, cls: str) -> dict[str, Any]:
    """The keys Qwen3-Next, Qwen3.5 and Qwen3.5-MoE share."""
    n = m.int("block_count") - m.int("nextn_predict_layers", 0, min=0)
    if n < 1:
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.nextn_predict_layers leaves no "
                          f"layer of the {m.int('block_count')} (block_count)")
    hidden, heads = m.int("embedding_length"), m.int("attention.head_count")
    head_dim = m.int("attention.key_length", hidden // heads)
    if m.int("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(f"{m.path}: {m.arch}.attention.value_length differs from "
                                    f"key_length {head_dim}")
    rot = m.int("rope.dimension_count", head_dim)
    if rot > head_dim:
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.rope.dimension_count {rot} exceeds "
                          f"the head dim {head_dim}")
    sections = m.raw(f"{m.arch}.rope.dimension_sections")
    if sections is not None and not (isinstance(sections, list) and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sections)):
        raise m._bad(f"{m.arch}.rope.dimension_sections", sections,
                     "non-negative integers (M-RoPE sections)")
    v_heads, inner = m.int("ssm.time_step_rank"), m.int("ssm.inner_size")
    if inner % v_heads:
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.ssm.time_step_rank {v_heads} (the "
                          f"value heads) does not divide ssm.inner_size {inner}")
    types = _delta_schedule(m, n, names)
    att = types.index("full_attention") if "full_attention" in types else 0
    cfg: dict[str, Any] = {
        "model_type": model_type, "architectures": [cls], "vocab_size": None,
        "hidden_size": hidden, "num_hidden_layers": n, "num_attention_heads": heads,
        "num_key_value_heads": m.int("attention.head_count_kv", heads), "head_dim": head_dim,
        "hidden_act": "silu", "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_parameters": {"rope_type": "default",
                            "rope_theta": m.float("rope.freq_base", 10000.0),
                            "partial_rotary_factor": rot / head_dim},
        "max_position_embeddings": m.int("context_length", 32768),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": f"blk.{att}.attn_q.bias" in names, "layer_types": types,
        "linear_conv_kernel_dim": m.int("ssm.conv_kernel"),
        "linear_key_head_dim": m.int("ssm.state_size"),
        "linear_num_key_heads": m.int("ssm.group_count"),
        "linear_num_value_heads": v_heads, "linear_value_head_dim": inner // v_heads,
        "torch_dtype": "float32"}
    cfg["vocab_size"] = _embedding(m, hidden)
    return cfg


def _delta_moe(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """Qwen3-Next's / Qwen3.5-MoE's experts with a gated shared expert."""
    n = cfg["num_hidden_layers"]
    moe = [f"blk.{i}.ffn_gate_inp.weight" in names for i in range(n)]
    cfg.update(num_experts=m.int("expert_count"), num_experts_per_tok=m.int("expert_used_count"),
               moe_intermediate_size=m.int("expert_feed_forward_length"),
               shared_expert_intermediate_size=m.int("expert_shared_feed_forward_length"))
    norm = m.raw(f"{m.arch}.expert_weights_norm")
    if norm is not None and norm is not True:  # llama.cpp's qwen3next always renormalises
        raise UnsupportedModelError(f"{m.path}: GGUF metadata {m.arch}.expert_weights_norm = "
                                    f"{norm!r}: this family always renormalises the top-k "
                                    f"weights")
    if cfg["model_type"] == "qwen3_next":
        cfg.update(norm_topk_prob=True, decoder_sparse_step=1,
                   mlp_only_layers=[i for i, e in enumerate(moe) if not e])
        ff = m.int("feed_forward_length", None, allow_list=True)
        cfg["intermediate_size"] = ff if ff is not None else cfg["moe_intermediate_size"]
    elif not all(moe):
        raise UnsupportedModelError(f"{m.path}: {m.arch} without experts on layers "
                                    f"{[i for i, e in enumerate(moe) if not e]}: Qwen3.5-MoE "
                                    f"has them on every layer")


def _qwen3next(m: _Meta, names: set[str]) -> dict[str, Any]:
    cfg = _gated_delta(m, names, "qwen3_next", "Qwen3NextForCausalLM")
    _delta_moe(m, cfg, names)
    return _ids(m, cfg)


def _qwen35(m: _Meta, names: set[str]) -> dict[str, Any]:
    cfg = _gated_delta(m, names, "qwen3_5_text", "Qwen3_5ForCausalLM")
    cfg["intermediate_size"] = m.int("feed_forward_length", allow_list=True)
    return _ids(m, cfg)


def _qwen35moe(m: _Meta, names: set[str]) -> dict[str, Any]:
    """Qwen3.5-MoE (text): transformers' ``Qwen3_5MoeTextConfig`` keys (no dense MLP width)."""
    cfg = _gated_delta(m, names, "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM")
    _delta_moe(m, cfg, names)
    return _ids(m, cfg)


def _qkvz(family: Any, parts: list[torch.Tensor]) -> torch.Tensor:
    """attn_qkv [q | k | v] (all heads) and attn_gate (z) -> Qwen3-Next's in_proj_qkvz, rows
    per key head [q, k, v, z]: the inverse of ``Qwen3NextModel.modify_tensors``."""
    s = family.mixers[0].settings
    qkv, z = parts
    d = family.hidden_size
    _want(qkv, (s.conv_dim, d), "attn_qkv")
    _want(z, (s.value_dim, d), "attn_gate")
    kh, per = s.k_heads, s.value_dim // s.k_heads
    q, k, v = qkv.split([s.key_dim, s.key_dim, s.value_dim])
    rows = [q.reshape(kh, s.d_k, d), k.reshape(kh, s.d_k, d), v.reshape(kh, per, d),
            z.reshape(kh, per, d)]
    return torch.cat(rows, dim=1).reshape(-1, d)


def _grouped(t: torch.Tensor, dim: int, s: Any, width: int) -> torch.Tensor:
    """Value heads back from llama.cpp's tiled order [v0 of every key head, v1, ...] to the
    checkpoint's grouped order (by key head) along `dim` (heads x `width` there): the inverse
    of ``_LinearAttentionVReorderBase._reorder_v_heads``."""
    kh, r = s.k_heads, s.v_heads // s.k_heads
    if kh == s.v_heads:
        return t
    shape = list(t.shape)
    if shape[dim] != s.v_heads * width:
        raise ValueError(f"dimension {dim} must be {s.v_heads} value heads x {width}")
    t = t.reshape(*shape[:dim], r, kh, width, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).reshape(shape)


def _v_rows(width: str) -> Any:
    def fix(family: Any, t: torch.Tensor) -> torch.Tensor:
        s = family.mixers[0].settings
        return _grouped(t, 0, s, s.d_v if width == "d_v" else 1)
    return fix


def _v_qkv(family: Any, t: torch.Tensor) -> torch.Tensor:
    """attn_qkv / the squeezed conv: the v rows after q and k."""
    s = family.mixers[0].settings
    qk = 2 * s.key_dim
    if t.shape[0] != s.conv_dim:
        raise ValueError(f"rows must be q, k and v: {s.conv_dim}")
    return torch.cat([t[:qk], _grouped(t[qk:], 0, s, s.d_v)])


def _v_out(family: Any, t: torch.Tensor) -> torch.Tensor:
    s = family.mixers[0].settings
    return _grouped(t, 1, s, s.d_v) if t.dim() == 2 else t


def _then(*fns: Any) -> Any:
    def fix(family: Any, t: torch.Tensor) -> torch.Tensor:
        for fn in fns:
            t = fn(family, t)
        return t
    return fix


_DELTA_ATTN = {"attn_norm": "ln1", "post_attention_norm": "ln2", "attn_q": "q", "attn_k": "k",
               "attn_v": "v", "attn_output": "o", "attn_q_norm": "q_norm",
               "attn_k_norm": "k_norm", "ssm_conv1d": "mixer:conv1d", "ssm_a": "mixer:A_log",
               "ssm_dt.bias": "mixer:dt_bias", "ssm_norm": "mixer:norm",
               "ssm_out": "mixer:out_proj"}
_DENSE = {"ffn_gate": "mlp_in", "ffn_up": "mlp_up", "ffn_down": "mlp_out"}
_QWEN3NEXT = {**_DELTA_ATTN, **_MOE_SLOTS, **_DENSE, "ssm_in": "mixer:in_proj_qkvz",
              "attn_qkv.weight": "join:mixer:in_proj_qkvz.weight",
              "attn_gate.weight": "join:mixer:in_proj_qkvz.weight", "ssm_ba": "mixer:in_proj_ba"}
_QWEN35 = {**_DELTA_ATTN, "attn_qkv": "mixer:in_proj_qkv", "attn_gate": "mixer:in_proj_z",
           "ssm_beta": "mixer:in_proj_b", "ssm_alpha": "mixer:in_proj_a"}
_QWEN35_CONVERT = {"attn_qkv.weight": _v_qkv, "attn_gate.weight": _v_rows("d_v"),
                   "ssm_beta.weight": _v_rows("1"), "ssm_alpha.weight": _v_rows("1"),
                   "ssm_a": _then(_v_rows("1"), _a_log), "ssm_dt.bias": _v_rows("1"),
                   "ssm_conv1d.weight": _then(_v_qkv, _conv), "ssm_out.weight": _v_out}

HYBRID_GGUF_ARCHES: dict[str, GgufArch] = {
    "granitehybrid": GgufArch(
        "granitemoehybrid", "GraniteMoeHybridForCausalLM", _MAMBA2, permute_qk=True,
        own_config=_granitehybrid, slots=_granitehybrid_slots, convert=_MAMBA2_CONVERT,
        joins={"moe:{block}.input_linear.weight": Join(
                   ("ffn_gate_exps.weight", "ffn_up_exps.weight"), _halves),
               "moe:shared_mlp.input_linear.weight": Join(
                   ("ffn_gate_shexp.weight", "ffn_up_shexp.weight"), _halves),
               "gate_up.weight": Join(("ffn_gate.weight", "ffn_up.weight"), _halves)}),
    "nemotron_h": GgufArch(
        "nemotron_h", "NemotronHForCausalLM", {**_MAMBA2, "ffn_up": "mlp_in",
                                               "ffn_down": "mlp_out"},
        permute_qk=True, own_config=_nemotron_h, convert=_MAMBA2_CONVERT,
        relabel=_nemotron_relabel),
    "nemotron_h_moe": GgufArch(
        "nemotron_h", "NemotronHForCausalLM", {**_MAMBA2, **_MOE_SLOTS, "ffn_up": "mlp_in",
                                               "ffn_down": "mlp_out",
                                               "ffn_latent_down": "moe:{block}.fc1_latent_proj",
                                               "ffn_latent_up": "moe:{block}.fc2_latent_proj"},
        permute_qk=True, own_config=_nemotron_h_moe, convert=_MAMBA2_CONVERT,
        relabel=_nemotron_relabel),
    "qwen3next": GgufArch(
        "qwen3_next", "Qwen3NextForCausalLM", _QWEN3NEXT, norm_offset=1.0,
        unoffset=("ssm_norm",), own_config=_qwen3next,
        convert={"ssm_a": _a_log, "ssm_conv1d.weight": _conv},
        joins={"mixer:in_proj_qkvz.weight": Join(("attn_qkv.weight", "attn_gate.weight"),
                                                 _qkvz)}),
    "qwen35": GgufArch("qwen3_5_text", "Qwen3_5ForCausalLM", {**_QWEN35, **_DENSE},
                       norm_offset=1.0, unoffset=("ssm_norm",), own_config=_qwen35,
                       convert=_QWEN35_CONVERT),
    "qwen35moe": GgufArch("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", {**_QWEN35, **_MOE_SLOTS},
                          norm_offset=1.0, unoffset=("ssm_norm",), own_config=_qwen35moe,
                          convert=_QWEN35_CONVERT),
}
