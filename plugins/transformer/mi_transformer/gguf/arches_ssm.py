"""GGUF architectures of the state-space families: ``mamba`` (Mamba and Falcon-Mamba),
``mamba2`` and the hybrid ``jamba``, whose layers run mi-ssm's mixers
(:mod:`mi_transformer.config.families_ssm`, :mod:`~mi_transformer.config.families_hybrid`).

What llama.cpp's converter (``convert_hf_to_gguf.py``: ``MambaModel``, ``Mamba2Model``)
changes, undone here: ``A_log`` is stored as ``A = -exp(A_log)`` (``ssm_a``, read back as
``log(-A)``: float32 exact to about 1e-7 relative, not bit for bit), the depthwise conv
[channels, 1, kernel] squeezed to [channels, kernel]; Mamba-2's A and D stored [heads, 1],
its ``dt_bias`` as ``ssm_dt.bias`` and its gated norm [groups, d_inner / groups]. The
metadata is the ``ssm.*`` keys (conv kernel, inner size, state size, time-step rank, which is
Mamba-2's head count, group count); Falcon-Mamba is Mamba with ``ssm.dt_b_c_rms`` true (its
B / C / dt norms' epsilon is not written: transformers' default, 1e-6, is taken, which the
published Falcon-Mamba has; llama.cpp runs them with the layer norms' epsilon). The
vocabulary size is the embedding's rows (the converter pads the token list to a multiple of
8 or 16).

Jamba (``JambaModel``): the same Mamba tensors (plus its dt / B / C norm gains) beside
attention layers; which layers attend is the per-layer ``attention.head_count_kv`` (0 on
Mamba layers), which layers have experts the ``ffn_gate_inp`` tensors present: both are
written back as transformers' period / offset schedule (refused when not periodic).
"""

from __future__ import annotations

from typing import Any

import torch

from mi_core.plugin import ConfigError, UnsupportedModelError

from mi_transformer.gguf.arches import GgufArch, _Meta


_CLASSES = {"mamba": "MambaForCausalLM", "falcon_mamba": "FalconMambaForCausalLM",
            "mamba2": "Mamba2ForCausalLM"}


def _common(m: _Meta, names: set[str], model_type: str) -> dict[str, Any]:
    """The keys every state-space config has, from ``ssm.*``, the block norm's epsilon and
    the tensors present (biases, an untied head)."""
    hidden, inner = m.int("embedding_length"), m.int("ssm.inner_size")
    if inner % hidden:
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.ssm.inner_size {inner} is not a "
                          f"multiple of {m.arch}.embedding_length {hidden}")
    emb = m.shapes.get("token_embd.weight")
    if emb is None or len(emb) != 2 or emb[1] != hidden:
        raise ConfigError(f"{m.path}: token_embd.weight of shape {emb} does not give the "
                          f"vocabulary of an embedding of width {hidden}")
    return {"architectures": [_CLASSES[model_type]],
            "model_type": model_type, "vocab_size": emb[0], "hidden_size": hidden,
            "num_hidden_layers": m.int("block_count"), "intermediate_size": inner,
            "expand": inner // hidden, "state_size": m.int("ssm.state_size"),
            "conv_kernel": m.int("ssm.conv_kernel"),
            "layer_norm_epsilon": m.float("attention.layer_norm_rms_epsilon", 1e-5),
            "use_conv_bias": "blk.0.ssm_conv1d.bias" in names,
            "use_bias": "blk.0.ssm_in.bias" in names, "hidden_act": "silu",
            "tie_word_embeddings": "output.weight" not in names, "residual_in_fp32": True,
            "torch_dtype": "float32"}


def _mamba(m: _Meta, names: set[str]) -> dict[str, Any]:
    falcon = m.bool("ssm.dt_b_c_rms", False)
    cfg = _common(m, names, "falcon_mamba" if falcon else "mamba")
    cfg["time_step_rank"] = m.int("ssm.time_step_rank")
    if falcon:
        cfg["mixer_rms_eps"] = 1e-6  # not in the file: transformers' (and the published) value
    return cfg


def _mamba2(m: _Meta, names: set[str]) -> dict[str, Any]:
    cfg = _common(m, names, "mamba2")
    heads = m.int("ssm.time_step_rank")  # llama.cpp writes the head count there
    if cfg["intermediate_size"] % heads:
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.ssm.time_step_rank {heads} (the "
                          f"heads) does not divide ssm.inner_size {cfg['intermediate_size']}")
    cfg.update(num_heads=heads, head_dim=cfg.pop("intermediate_size") // heads,
               n_groups=m.int("ssm.group_count", 1))  # Mamba2Config has no intermediate_size
    return cfg


def _schedule(m: _Meta, flags: list[bool], what: str) -> tuple[int, int]:
    """(period, offset) with ``flags[i] == (i % period == offset)``: transformers' Jamba
    schedule of `flags` (no layer marked: an offset past the last layer)."""
    n = len(flags)
    for period in range(1, n + 2):
        for offset in range(period):
            if all(f == (i % period == offset) for i, f in enumerate(flags)):
                return period, offset
    marked = [i for i, f in enumerate(flags) if f]
    raise UnsupportedModelError(f"{m.path}: the {what} layers {marked} are not every "
                                f"period-th layer from an offset (Jamba's schedule)")


def _jamba(m: _Meta, names: set[str]) -> dict[str, Any]:
    """Jamba: the Mamba keys, attention and expert schedules, sizes."""
    hidden, inner, n = m.int("embedding_length"), m.int("ssm.inner_size"), m.int("block_count")
    key = f"{m.arch}.attention.head_count_kv"
    kv = m.raw(key)
    if not (isinstance(kv, list) and len(kv) == n and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in kv)
            and len({x for x in kv if x}) == 1):
        raise m._bad(key, kv, f"{n} integers, the KV heads of the attention layers (one "
                              f"value) and 0 for the Mamba ones")
    if inner % hidden:
        raise ConfigError(f"{m.path}: GGUF metadata {m.arch}.ssm.inner_size {inner} is not a "
                          f"multiple of {m.arch}.embedding_length {hidden}")
    emb = m.shapes.get("token_embd.weight")
    if emb is None or len(emb) != 2 or emb[1] != hidden:
        raise ConfigError(f"{m.path}: token_embd.weight of shape {emb} does not give the "
                          f"vocabulary of an embedding of width {hidden}")
    attn_period, attn_offset = _schedule(m, [x > 0 for x in kv], "attention")
    moe_period, moe_offset = _schedule(
        m, [f"blk.{i}.ffn_gate_inp.weight" in names for i in range(n)], "mixture-of-experts")
    return {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "vocab_size": emb[0],
            "hidden_size": hidden, "num_hidden_layers": n,
            "num_attention_heads": m.int("attention.head_count"),
            "num_key_value_heads": max(kv), "intermediate_size": m.int("feed_forward_length"),
            "attn_layer_period": attn_period, "attn_layer_offset": attn_offset,
            "expert_layer_period": moe_period, "expert_layer_offset": moe_offset,
            "num_experts": m.int("expert_count", 1),
            "num_experts_per_tok": m.int("expert_used_count", 1),
            "mamba_d_state": m.int("ssm.state_size"), "mamba_d_conv": m.int("ssm.conv_kernel"),
            "mamba_expand": inner // hidden, "mamba_dt_rank": m.int("ssm.time_step_rank"),
            "mamba_conv_bias": "blk.0.ssm_conv1d.bias" in names,
            "mamba_proj_bias": "blk.0.ssm_in.bias" in names,
            "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon", 1e-6),
            "max_position_embeddings": m.int("context_length", 262144), "hidden_act": "silu",
            "tie_word_embeddings": "output.weight" not in names, "torch_dtype": "float32"}


def _a_log(family: Any, a: torch.Tensor) -> torch.Tensor:
    """``ssm_a`` (A = -exp(A_log), Mamba-2's [heads, 1]) -> A_log as the family stores it."""
    if family.mixers[0].name == "mamba2":  # (Jamba's first mixer is its Mamba)
        a = a.reshape(a.shape[0]) if a.dim() == 2 and a.shape[1] == 1 else a
    if not bool((a < 0).all()):
        raise ValueError("ssm_a holds A = -exp(A_log): every value must be negative")
    return torch.log(-a.double()).float()


def _column(family: Any, t: torch.Tensor) -> torch.Tensor:
    """Mamba-2's D [heads, 1] -> [heads]."""
    return t.reshape(t.shape[0]) if t.dim() == 2 and t.shape[1] == 1 else t


def _conv(family: Any, t: torch.Tensor) -> torch.Tensor:
    """The squeezed depthwise conv [channels, kernel] -> [channels, 1, kernel]."""
    return t.unsqueeze(1) if t.dim() == 2 else t


def _flat(family: Any, t: torch.Tensor) -> torch.Tensor:
    """Mamba-2's gated norm [groups, d_inner / groups] -> [d_inner]."""
    return t.reshape(-1) if t.dim() == 2 else t


_SSM = {"attn_norm": "ln1", "ssm_in": "mixer:in_proj", "ssm_conv1d": "mixer:conv1d",
        "ssm_a": "mixer:A_log", "ssm_d": "mixer:D", "ssm_out": "mixer:out_proj"}

_JAMBA = {"attn_norm": "ln1", "ffn_norm": "ln2", "attn_q": "q", "attn_k": "k", "attn_v": "v",
          "attn_output": "o", "ffn_gate": "mlp_in", "ffn_up": "mlp_up", "ffn_down": "mlp_out",
          "ffn_gate_inp": "moe:{block}.{router}", "ffn_gate_exps": "exps:0",
          "ffn_up_exps": "exps:1", "ffn_down_exps": "exps:2", "ssm_dt_norm": "mixer:dt_layernorm",
          "ssm_b_norm": "mixer:b_layernorm", "ssm_c_norm": "mixer:c_layernorm"}

SSM_GGUF_ARCHES: dict[str, GgufArch] = {
    "mamba": GgufArch("mamba", "MambaForCausalLM", {
        **_SSM, "ssm_x": "mixer:x_proj", "ssm_dt": "mixer:dt_proj"}, own_config=_mamba,
        convert={"ssm_a": _a_log, "ssm_conv1d.weight": _conv}),
    "mamba2": GgufArch("mamba2", "Mamba2ForCausalLM", {
        **_SSM, "ssm_dt.bias": "mixer:dt_bias", "ssm_norm": "mixer:norm"}, own_config=_mamba2,
        convert={"ssm_a": _a_log, "ssm_d": _column, "ssm_conv1d.weight": _conv,
                 "ssm_norm.weight": _flat}),
    "jamba": GgufArch("jamba", "JambaForCausalLM", {
        **_SSM, "ssm_x": "mixer:x_proj", "ssm_dt": "mixer:dt_proj", **_JAMBA},
        own_config=_jamba, convert={"ssm_a": _a_log, "ssm_conv1d.weight": _conv}),
}
