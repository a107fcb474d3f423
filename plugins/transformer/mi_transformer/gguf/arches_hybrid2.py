"""GGUF architectures of the hybrids whose layers the first hybrids' schedule does not express
(:mod:`mi_transformer.config.families_hybrid2`): ``falcon-h1`` (Falcon-H1: attention beside a
Mamba-2 mixer in every layer), ``lfm2`` and ``lfm2moe`` (LFM2, LFM2-MoE: a gated short
convolution interleaved with attention).

What llama.cpp's converter (``conversion/falcon_h1.py``: ``FalconH1Model``, a
``Mamba2Model``; ``conversion/lfm2.py``: ``LFM2Model``, ``LFM2MoeModel``) changes, undone here:

- falcon-h1: Mamba-2's layout as in ``mamba2`` (``A = -exp(A_log)`` [heads, 1], ``D``
  [heads, 1], ``dt_bias`` as ``ssm_dt.bias``, the conv squeezed, the gated norm [groups,
  d_ssm / groups]); the pre-MLP norm as ``blk.N.ffn_norm`` without a suffix (gguf's tensor
  map reads ``pre_ff_layernorm.weight`` whole; ``ffn_norm.weight`` is read too). The q / k
  rows are not permuted (llama.cpp rotates Falcon-H1 NeoX-style). Every multiplier is folded
  into the weights and none is written: ``embedding_multiplier`` into ``token_embd``,
  ``lm_head_multiplier`` into ``output``, ``key_multiplier`` x ``attention_in_multiplier``
  into ``attn_k``, ``attention_in_multiplier`` into ``attn_q`` / ``attn_v``,
  ``attention_out_multiplier`` into ``attn_output``, ``ssm_in_multiplier`` and the five
  ``ssm_multipliers`` (rows [z | x | B | C | dt]) into ``ssm_in``, ``ssm_out_multiplier`` into
  ``ssm_out``, ``mlp_multipliers`` into ``ffn_gate`` / ``ffn_down`` (biases included). The
  file's numbers are then a Falcon-H1 whose multipliers are all 1: the config says so, and
  the logits and every residual stream equal the source checkpoint's to float32 rounding of
  the products (the multipliers themselves cannot be recovered; ``attn.hook_in``,
  ``ssm.hook_in`` and ``attn.hook_result``, on the other side of a folded multiplier, see
  the values scaled by it). Refused by name where the fold cannot be undone: a file
  without ``output.weight`` (a tied head: its logits would be scaled by
  ``embedding_multiplier`` instead of ``lm_head_multiplier``), and q / k / v or ``ssm_in``
  biases (scaled by ``attention_in_multiplier`` / ``ssm_in_multiplier``, which act on the
  input, not on the bias); a file of tiiuae's pre-upstream converter (its multipliers as
  metadata, ``ssm_mup_vec`` tensors, the weights unfolded) is refused too. Not in the file:
  the gated norm's place (``ssm_norm`` present is llama.cpp's norm after the gate,
  ``mamba_norm_before_gate: false``, as released) and the dt limit (none, as transformers'
  default).
- lfm2 / lfm2moe: the short convolution's kernel squeezed [d, 1, L] -> [d, L]; the final
  norm (``embedding_norm``) as ``token_embd_norm``; which layers attend is the per-layer
  ``attention.head_count_kv`` (0 on convolution layers); LFM2's MLP width written already
  adjusted (``block_auto_adjust_ff_dim`` false in the config, as transformers' own GGUF
  conversion says); LFM2-MoE's experts stacked [experts, rows, cols], its expert bias as
  ``exp_probs_b.bias``, the dense leading layers as ``leading_dense_block_count``, the
  sigmoid router as ``expert_gating_func`` 2. Not in the file: LFM2-MoE's
  ``routed_scaling_factor`` and ``norm_topk_prob`` (llama.cpp renormalises the chosen
  weights and scales them by ``expert_weights_scale`` when written, else not: 1.0 and true,
  the released values).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mi_core.plugin import ConfigError, UnsupportedModelError, WeightLoadError

from mi_transformer.gguf.arches import _MOE_SLOTS, GgufArch, _Meta
from mi_transformer.gguf.arches_hybrid import (
    _MAMBA2_CONVERT, _embedding, _ids, _mamba2_sizes, _per_layer,
)
from mi_transformer.gguf.arches_ssm import _conv


def _uniform(m: _Meta, key: str, default: Any = None) -> Any:
    """``{arch}.<key>``: one integer, or per-layer integers that are all the same (llama.cpp
    writes some keys per layer)."""
    return m.int(key, default, allow_list=True)


def _block_count(m: _Meta, names: set[str]) -> int:
    """``block_count``, which must be the layers the tensor table holds (every layer of these
    families has tensors; checked before any per-layer list is built)."""
    n = m.int("block_count")
    layers = {int(t.split(".")[1]) for t in names
              if t.startswith("blk.") and t.split(".")[1].isdigit()}
    if len(layers) != n or layers != set(range(n)):  # (the length first: n may be 2**32)
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.block_count = {n}, but the file "
                          f"has tensors of {len(layers)} layers")
    return n


def _on_every(m: _Meta, names: set[str], layers: list[int], tensor: str) -> bool:
    """Whether the optional tensor ``blk.N.<tensor>`` (a bias, a norm) is in each of `layers`
    (a config flag): all or none, else a WeightLoadError naming where it is."""
    have = [i for i in layers if f"blk.{i}.{tensor}" in names]
    if have and len(have) != len(layers):
        raise WeightLoadError(f"{m.path}: tensor 'blk.{have[0]}.{tensor}' is on layers {have} "
                              f"only; this {m.arch} configuration has it on all of {layers} "
                              f"or none")
    return bool(have)


def _no_rope_scaling(m: _Meta) -> None:
    kind = m.str(f"{m.arch}.rope.scaling.type", "none")
    if kind not in ("none", None):
        raise UnsupportedModelError(f"{m.path}: GGUF metadata {m.arch}.rope.scaling.type = "
                                    f"{kind!r}: this family has no rope scaling")


# ----------------------------------------------------------------------------------------
# falcon-h1
# ----------------------------------------------------------------------------------------

#: Falcon-H1's multipliers, all folded into the weights by the converter: 1 in the config
_FALCON_ONES: dict[str, Any] = {
    "embedding_multiplier": 1.0, "lm_head_multiplier": 1.0, "key_multiplier": 1.0,
    "attention_in_multiplier": 1.0, "attention_out_multiplier": 1.0, "ssm_in_multiplier": 1.0,
    "ssm_out_multiplier": 1.0, "ssm_multipliers": [1.0] * 5, "mlp_multipliers": [1.0, 1.0]}


#: metadata of tiiuae's pre-upstream converter (github.com/tiiuae/llama.cpp-Falcon-H1), whose
#: files keep the weights unfolded and the multipliers (and a ``ssm_mup_vec`` tensor) apart
_FORK_KEYS = ("key_multiplier", "lm_head_multiplier", "embedding_multiplier",
              "attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier",
              "ssm_out_multiplier", "mlp_gate_multiplier", "mlp_down_multiplier", "ssm.has_mup",
              "mamba_norm_before_gate", "mamba_rms_norm", "mamba_use_mlp")


def _falcon_unfoldable(m: _Meta, names: set[str], n: int) -> None:
    """The files whose numbers this mapping cannot give: the pre-upstream format, and the
    tensors whose folded multiplier cannot be divided out (module docstring)."""
    fork = [f"GGUF metadata {m.arch}.{k}" for k in _FORK_KEYS if f"{m.arch}.{k}" in m.md]
    fork += [f"tensor {t!r}" for t in sorted(names) if t.endswith(".ssm_mup_vec")][:1]
    if fork:
        raise UnsupportedModelError(
            f"{m.path}: {fork[0]}: a falcon-h1 GGUF of tiiuae's pre-upstream converter "
            f"(llama.cpp-Falcon-H1: the multipliers as metadata and ssm_mup_vec tensors, the "
            f"weights unfolded) is not supported; llama.cpp's own converter folds the "
            f"multipliers into the weights, and its files load")
    if "output.weight" not in names:
        raise UnsupportedModelError(
            f"{m.path}: a falcon-h1 GGUF without output.weight (a tied head) is not supported: "
            f"llama.cpp's converter folds embedding_multiplier into token_embd.weight, which "
            f"then also serves as the head, while the checkpoint's logits are scaled by "
            f"lm_head_multiplier; neither is in the file, so the logits cannot be recovered")
    for i in range(n):
        for t, mult in (("attn_q", "attention_in_multiplier"),
                        ("attn_k", "attention_in_multiplier"),
                        ("attn_v", "attention_in_multiplier"), ("ssm_in", "ssm_in_multiplier")):
            if f"blk.{i}.{t}.bias" in names:
                raise UnsupportedModelError(
                    f"{m.path}: tensor 'blk.{i}.{t}.bias' is not supported in a falcon-h1 GGUF: "
                    f"llama.cpp's converter multiplies it by {mult}, which scales the layer's "
                    f"input (not the bias) and is not in the file, so the bias cannot be "
                    f"recovered")


def _falcon_h1(m: _Meta, names: set[str]) -> dict[str, Any]:
    """Falcon-H1: attention and Mamba-2 in every layer; the multipliers 1 (folded)."""
    n, hidden = _block_count(m, names), m.int("embedding_length")
    _falcon_unfoldable(m, names, n)
    _no_rope_scaling(m)
    heads = m.int("attention.head_count")
    head_dim = m.int("attention.key_length", hidden // heads)
    if m.int("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(f"{m.path}: {m.arch}.attention.value_length differs from "
                                    f"key_length {head_dim}")
    scale = m.float("attention.scale", None)
    if scale is not None and not math.isclose(scale, head_dim ** -0.5, rel_tol=1e-6):
        raise UnsupportedModelError(f"{m.path}: GGUF metadata {m.arch}.attention.scale = "
                                    f"{scale}: Falcon-H1 scales scores by 1 / sqrt(head_dim) "
                                    f"= {head_dim ** -0.5}")
    s = _mamba2_sizes(m)
    every = list(range(n))
    cfg: dict[str, Any] = {
        "model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"],
        "vocab_size": _embedding(m, hidden), "hidden_size": hidden, "num_hidden_layers": n,
        "num_attention_heads": heads,
        "num_key_value_heads": _uniform(m, "attention.head_count_kv", heads),
        "head_dim": head_dim, "intermediate_size": _uniform(m, "feed_forward_length"),
        "hidden_act": "silu", "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": m.float("rope.freq_base", 10000.0),
        "max_position_embeddings": m.int("context_length", 8192),
        "tie_word_embeddings": False, "attention_bias": False,
        "mlp_bias": _on_every(m, names, every, "ffn_up.bias"),
        "mamba_d_ssm": s["inner"], "mamba_n_heads": s["heads"], "mamba_d_head": s["head_dim"],
        "mamba_n_groups": s["groups"], "mamba_d_state": s["state"], "mamba_d_conv": s["conv"],
        "mamba_conv_bias": _on_every(m, names, every, "ssm_conv1d.bias"),
        "mamba_proj_bias": False, "projectors_bias": _on_every(m, names, every, "ssm_out.bias"),
        "mamba_rms_norm": _on_every(m, names, every, "ssm_norm.weight"),
        "mamba_norm_before_gate": False,
        **_FALCON_ONES, "torch_dtype": "float32"}
    return _ids(m, cfg)


def _group_norm(family: Any, t: torch.Tensor) -> torch.Tensor:
    """The gated norm [groups, d_ssm / groups] -> [d_ssm], the groups checked (a flat
    reshape would take any grouping)."""
    s = family.mixers[0].settings
    if tuple(t.shape) != (s.n_groups, s.d_inner // s.n_groups):
        raise ValueError(f"the gated norm must be [groups, d_ssm / groups] = "
                         f"{[s.n_groups, s.d_inner // s.n_groups]}")
    return t.reshape(-1)


_FALCON_H1 = {"attn_norm": "ln1", "ffn_norm": "ln2.weight", "ffn_norm.weight": "ln2.weight",
              "attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
              "ssm_in": "mixer:in_proj", "ssm_conv1d": "mixer:conv1d", "ssm_a": "mixer:A_log",
              "ssm_d": "mixer:D", "ssm_dt.bias": "mixer:dt_bias", "ssm_norm": "mixer:norm",
              "ssm_out": "mixer:out_proj", "ffn_gate": "mlp_in", "ffn_up": "mlp_up",
              "ffn_down": "mlp_out"}


# ----------------------------------------------------------------------------------------
# lfm2, lfm2moe
# ----------------------------------------------------------------------------------------

def _lfm2_common(m: _Meta, names: set[str], model_type: str, cls: str) -> dict[str, Any]:
    """The keys LFM2 and LFM2-MoE share: the schedule from the per-layer KV heads, the
    short convolution, attention with q/k norms and RoPE."""
    n, hidden = _block_count(m, names), m.int("embedding_length")
    kv = _per_layer(m, "attention.head_count_kv", n, "the KV heads of the attention layers "
                    "(one value) and 0 for the convolution ones")
    have = [i for i in range(n) if f"blk.{i}.attn_q.weight" in names]
    if have != [i for i, k in enumerate(kv) if k]:
        raise ConfigError(f"{m.path}: the attention layers of GGUF metadata "
                          f"{m.arch}.attention.head_count_kv ({[i for i, k in enumerate(kv) if k]})"
                          f" are not the layers with attention tensors ({have})")
    if m.raw(f"{m.arch}.attention.causal") is False:
        raise UnsupportedModelError(f"{m.path}: GGUF metadata {m.arch}.attention.causal = "
                                    f"false (a bidirectional LFM2 encoder) is not supported")
    window = m.int("attention.sliding_window", None, min=0)
    if window:
        raise UnsupportedModelError(f"{m.path}: GGUF metadata {m.arch}.attention.sliding_window "
                                    f"= {window}: transformers' {model_type} has no sliding "
                                    f"window")
    _no_rope_scaling(m)
    heads = m.int("attention.head_count")
    convs = [i for i, k in enumerate(kv) if not k]
    cfg: dict[str, Any] = {
        "model_type": model_type, "architectures": [cls], "vocab_size": _embedding(m, hidden),
        "hidden_size": hidden, "num_hidden_layers": n, "num_attention_heads": heads,
        "num_key_value_heads": max(kv) or heads,
        "layer_types": ["full_attention" if k else "conv" for k in kv],
        "intermediate_size": _uniform(m, "feed_forward_length"),
        "norm_eps": m.float("attention.layer_norm_rms_epsilon", 1e-5),
        "conv_L_cache": m.int("shortconv.l_cache"),
        "conv_bias": _on_every(m, names, convs, "shortconv.conv.bias"),
        "rope_theta": m.float("rope.freq_base", 1000000.0),
        "max_position_embeddings": m.int("context_length", 128000),
        "tie_word_embeddings": "output.weight" not in names, "torch_dtype": "float32"}
    key_length = m.int("attention.key_length", None)
    if key_length is not None:
        cfg["head_dim"] = key_length
    return cfg


def _lfm2(m: _Meta, names: set[str]) -> dict[str, Any]:
    """LFM2: the MLP width as written (already adjusted by the converter)."""
    cfg = _lfm2_common(m, names, "lfm2", "Lfm2ForCausalLM")
    cfg["block_auto_adjust_ff_dim"] = False
    return _ids(m, cfg)


def _lfm2moe(m: _Meta, names: set[str]) -> dict[str, Any]:
    """LFM2-MoE: the leading dense layers, then sigmoid-routed experts with an expert bias."""
    cfg = _lfm2_common(m, names, "lfm2_moe", "Lfm2MoeForCausalLM")
    n = cfg["num_hidden_layers"]
    dense = m.int("leading_dense_block_count", 0, min=0)
    gating = m.int("expert_gating_func", None, min=0)
    if gating != 2:  # gguf.ExpertGatingFuncType.SIGMOID, which llama.cpp requires here
        raise UnsupportedModelError(f"{m.path}: GGUF metadata {m.arch}.expert_gating_func = "
                                    f"{gating!r}: LFM2-MoE's router is the sigmoid (2)")
    norm = m.raw(f"{m.arch}.expert_weights_norm")
    if norm is not None and norm is not True:  # llama.cpp's lfm2moe always renormalises
        raise UnsupportedModelError(f"{m.path}: GGUF metadata {m.arch}.expert_weights_norm = "
                                    f"{norm!r}: LFM2-MoE renormalises the chosen weights")
    scale = m.raw(f"{m.arch}.expert_weights_scale")
    # absent or 0: llama.cpp does not scale (transformers' routed_scaling_factor 1.0)
    routed = 1.0 if scale in (None, 0) else m.float("expert_weights_scale")
    cfg.update(num_experts=m.int("expert_count"), num_experts_per_tok=m.int("expert_used_count"),
               moe_intermediate_size=m.int("expert_feed_forward_length"),
               num_dense_layers=dense, norm_topk_prob=True, routed_scaling_factor=routed,
               use_expert_bias=_on_every(m, names, list(range(dense, n)), "exp_probs_b.bias"))
    if cfg["num_experts_per_tok"] > cfg["num_experts"]:
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.expert_used_count "
                          f"{cfg['num_experts_per_tok']} exceeds expert_count "
                          f"{cfg['num_experts']}")
    return _ids(m, cfg)


_LFM2 = {"attn_norm": "ln1", "ffn_norm": "ln2", "attn_q": "q", "attn_k": "k", "attn_v": "v",
         "attn_output": "o", "attn_q_norm": "q_norm", "attn_k_norm": "k_norm",
         "shortconv.conv": "mixer:conv", "shortconv.in_proj": "mixer:in_proj",
         "shortconv.out_proj": "mixer:out_proj", "ffn_gate": "mlp_in", "ffn_up": "mlp_up",
         "ffn_down": "mlp_out"}
#: LFM2's final norm (``embedding_norm``), which llama.cpp names ``token_embd_norm``
_LFM2_GLOBAL = {"token_embd_norm.weight": "final_norm.weight"}
_LFM2_CONVERT = {"shortconv.conv.weight": _conv}

HYBRID2_GGUF_ARCHES: dict[str, GgufArch] = {
    "falcon-h1": GgufArch("falcon_h1", "FalconH1ForCausalLM", _FALCON_H1,
                          own_config=_falcon_h1,
                          convert={**_MAMBA2_CONVERT, "ssm_norm.weight": _group_norm}),
    "lfm2": GgufArch("lfm2", "Lfm2ForCausalLM", _LFM2, own_config=_lfm2,
                     convert=_LFM2_CONVERT, global_slots=_LFM2_GLOBAL),
    "lfm2moe": GgufArch("lfm2_moe", "Lfm2MoeForCausalLM", {**_LFM2, **_MOE_SLOTS},
                        own_config=_lfm2moe, convert=_LFM2_CONVERT, global_slots=_LFM2_GLOBAL),
}
