"""What llama.cpp's converter writes for the hybrid GGUF architectures ``granitehybrid``
(Granite 4.0-H, Bamba), ``nemotron_h``, ``nemotron_h_moe``, ``qwen3next``, ``qwen35`` and
``qwen35moe``, redone with the `gguf` package's GGUFWriter through
:func:`tests.support.gguf_convert.write`, independently of mi_transformer.gguf (whose inverse
mapping the tests check against it).

Followed: ggml-org/llama.cpp ``conversion/``: ``granite.py`` @ 010f22d8
(``GraniteHybridModel``, ``GraniteMoeModel``, ``GraniteModel``), ``llama.py`` @ 0274f0fc
(``LlamaModel.permute``, ``set_gguf_parameters``), ``mamba.py`` @ 32e9e044
(``Mamba2Model.modify_tensors``), ``nemotron.py`` @ 003ebfc1 (``NemotronHModel``, the
non-MoE and the MoE (``nemotron_h_moe``) paths), ``qwen.py`` @ 03173d5e (``Qwen2MoeModel``,
``Qwen3NextModel``, ``_LinearAttentionVReorderBase``, ``_Qwen35MRopeMixin``, ``_Qwen35MtpMixin``,
``Qwen3_5TextModel``, ``Qwen3_5MoeTextModel``), ``base.py`` @ 00bd27a6
(``TextModel.set_gguf_parameters``, the generic keys :func:`gguf_convert._generic` writes).
The converters read ``config.json``; each function says which hparams it sees.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.support.gguf_convert import _permute


def _layer(name: str) -> int | None:
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def _mamba2(name: str, a: np.ndarray, n_group: int, d_inner: int
            ) -> list[tuple[str, np.ndarray]]:
    """``Mamba2Model.modify_tensors``: dt_bias as dt_proj.bias, the conv squeezed, A and D
    [heads, 1], the gated norm [groups, d_inner / groups], A = -exp(A_log)."""
    if name.endswith(".dt_bias"):
        name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
    if name.endswith("conv1d.weight"):
        a = a.squeeze()
    elif name.endswith((".A_log", ".D")):
        a = a.reshape(*a.shape, 1)
    elif name.endswith("mixer.norm.weight") or name.endswith("mamba.norm.weight"):
        a = a.reshape(n_group, d_inner // n_group)
    if name.endswith(".A_log"):
        a = -np.exp(a)
    return [(name, a)]


def _llama_permute(name: str, a: np.ndarray, hp: dict) -> np.ndarray:
    """``LlamaModel.modify_tensors`` with ``undo_permute``: q / k weights and biases."""
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return _permute(a, hp["num_attention_heads"])
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return _permute(a, hp["num_key_value_heads"])
    return a


# ----------------------------------------------------------------------------------------
# granitehybrid
# ----------------------------------------------------------------------------------------

def _granite_attn_layers(hp: dict) -> list[int]:
    """``GraniteHybridModel.get_attn_layers``."""
    if hp.get("layer_types"):
        return [i for i, t in enumerate(hp["layer_types"]) if t == "attention"]
    return list(hp.get("attn_layer_indices") or [])


def granite_hparams(hp: dict) -> dict:
    """config.json as the hub's Granite 4.0-H / Bamba ship it: ``layer_types`` spelled
    "mamba" / "attention" (transformers 5 saves "linear_attention" / "full_attention", which
    ``get_attn_layers`` does not know), Bamba's ``attn_rotary_emb`` (half the head)."""
    hp = dict(hp)
    if hp.get("layer_types"):
        hp["layer_types"] = ["attention" if t in ("attention", "full_attention") else "mamba"
                             for t in hp["layer_types"]]
    if hp.get("model_type") == "bamba":
        hp["attn_rotary_emb"] = hp.get("head_dim") or \
            hp["hidden_size"] // hp["num_attention_heads"] // 2
        hp["architectures"] = ["BambaForCausalLM"]
    return hp


def granitehybrid_params(w: Any, hp: dict, rope: dict) -> None:
    """``GraniteHybridModel.set_gguf_parameters``: GraniteMoeModel's (GraniteModel's over
    LlamaModel's over the generic keys, ``head_dim`` popped first), then the Mamba-2 keys,
    the attention layers as per-layer KV heads, RoPE as ``rope.scaling.finetuned``."""
    n = hp["num_hidden_layers"]
    attn = _granite_attn_layers(hp)
    ssm = [i for i in range(n) if i not in attn]
    d_model = hp["hidden_size"]
    w.add_vocab_size(hp["vocab_size"])
    w.add_rope_dimension_count(d_model // hp["num_attention_heads"])
    for key, add in (("attention_multiplier", w.add_attention_scale),
                     ("embedding_multiplier", w.add_embedding_scale),
                     ("residual_multiplier", w.add_residual_scale),
                     ("logits_scaling", w.add_logit_scale)):
        if hp.get(key):
            add(hp[key])
    if hp.get("shared_intermediate_size"):
        w.add_expert_shared_feed_forward_length(hp["shared_intermediate_size"])
    w.add_ssm_conv_kernel(hp["mamba_d_conv"])
    w.add_ssm_state_size(hp["mamba_d_state"])
    w.add_ssm_group_count(hp["mamba_n_groups"])
    w.add_ssm_inner_size(hp["mamba_expand"] * d_model)
    w.add_ssm_time_step_rank(hp["mamba_n_heads"])
    if hp.get("attn_rotary_emb"):
        w.add_rope_dimension_count(hp["attn_rotary_emb"])
    w.add_head_count_kv([hp["num_key_value_heads"] if i in attn else 0 for i in range(n)])
    use_rope = "BambaForCausalLM" in (hp.get("architectures") or []) or not ssm
    w.add_rope_scaling_finetuned(use_rope)
    if not use_rope:
        w.add_context_length(2**20)


def granitehybrid_modify(hp: dict) -> Any:
    """``GraniteHybridModel.modify_tensors``: GraniteMoeModel's splits of the fused expert /
    shared MLP inputs, Mamba2Model's changes on the Mamba layers, LlamaModel's q / k
    permutation on the attention layers."""
    attn = _granite_attn_layers(hp)
    experts = bool(hp.get("num_local_experts"))
    d_inner = hp["mamba_expand"] * hp["hidden_size"]

    def modify(name: str, a: np.ndarray, _: dict) -> list[tuple[str, np.ndarray]]:
        bid = _layer(name)
        if name.endswith("block_sparse_moe.input_linear.weight"):
            f = hp["intermediate_size"]
            return [(f"blk.{bid}.ffn_gate_exps.weight", a[..., :f, :]),
                    (f"blk.{bid}.ffn_up_exps.weight", a[..., f:, :])]
        if name.endswith("shared_mlp.input_linear.weight"):
            f = hp["shared_intermediate_size"]
            kind = ("ffn_gate_shexp", "ffn_up_shexp") if experts else ("ffn_gate", "ffn_up")
            return [(f"blk.{bid}.{kind[0]}.weight", a[:f]), (f"blk.{bid}.{kind[1]}.weight", a[f:])]
        if name.endswith("shared_mlp.output_linear.weight") and not experts:
            return [(f"blk.{bid}.ffn_down.weight", a)]
        if bid is not None and bid not in attn:
            return _mamba2(name, a, hp["mamba_n_groups"], d_inner)
        return [(name, _llama_permute(name, a, hp))]
    return modify


# ----------------------------------------------------------------------------------------
# nemotron_h
# ----------------------------------------------------------------------------------------

#: transformers 5's NemotronHConfig.to_dict() keys of its mixture-of-experts / MTP defaults,
#: absent from the published non-MoE config.json (their presence makes the converter write
#: nemotron_h_moe)
_NEMOTRON_MOE_KEYS = ("n_routed_experts", "n_shared_experts", "moe_intermediate_size",
                      "moe_shared_expert_intermediate_size", "moe_latent_size",
                      "moe_shared_expert_overlap", "num_experts_per_tok",
                      "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob",
                      "num_nextn_predict_layers", "mtp_layers_block_type")
_NEMOTRON_LETTERS = {"linear_attention": "M", "mamba": "M", "full_attention": "*",
                     "attention": "*", "mlp": "-"}


def nemotron_h_hparams(hp: dict) -> dict:
    """config.json as the published Nemotron-H (non-MoE) ships it: the layer pattern as
    ``hybrid_override_pattern`` (with transformers 5's ``layers_block_type`` list the
    converter takes no layer for an MLP: its list spelling knows only "moe"), without the
    mixture-of-experts keys."""
    hp = {k: v for k, v in hp.items() if k not in _NEMOTRON_MOE_KEYS}
    hp["hybrid_override_pattern"] = "".join(_NEMOTRON_LETTERS[t]
                                            for t in hp.pop("layers_block_type"))
    hp["num_hidden_layers"] = len(hp["hybrid_override_pattern"])
    return hp


def nemotron_h_params(w: Any, hp: dict, rope: dict) -> None:
    """``NemotronHModel.set_gguf_parameters`` (non-MoE): GraniteHybridModel's keys (no
    multipliers, no RoPE) with ``d_inner`` = mamba_num_heads x mamba_head_dim, key / value
    length ``head_dim``, the per-layer MLP widths; the generic ``layer_norm_epsilon``."""
    pattern = hp["hybrid_override_pattern"]
    w.add_layer_norm_eps(hp["layer_norm_epsilon"])
    w.add_vocab_size(hp["vocab_size"])
    w.add_rope_dimension_count(hp["hidden_size"] // hp["num_attention_heads"])
    w.add_ssm_conv_kernel(hp["conv_kernel"])
    w.add_ssm_state_size(hp["ssm_state_size"])
    w.add_ssm_group_count(hp["n_groups"])
    w.add_ssm_inner_size(hp["mamba_num_heads"] * hp["mamba_head_dim"])
    w.add_ssm_time_step_rank(hp["mamba_num_heads"])
    w.add_head_count_kv([hp["num_key_value_heads"] if c == "*" else 0 for c in pattern])
    w.add_rope_scaling_finetuned(False)
    w.add_context_length(2**20)
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_feed_forward_length([hp["intermediate_size"] if c == "-" else 0 for c in pattern])


def nemotron_h_modify(hp: dict) -> Any:
    """``NemotronHModel.modify_tensors`` (non-MoE, through GraniteHybridModel's): Mamba2Model's
    changes on the Mamba layers, q / k permuted on the attention layers."""
    pattern = hp["hybrid_override_pattern"]
    d_inner = hp["mamba_num_heads"] * hp["mamba_head_dim"]

    def modify(name: str, a: np.ndarray, _: dict) -> list[tuple[str, np.ndarray]]:
        bid = _layer(name)
        if bid is not None and pattern[bid] == "M":
            return _mamba2(name, a, hp["n_groups"], d_inner)
        return [(name, _llama_permute(name, a, hp))]
    return modify


def nemotron_h_moe_hparams(hp: dict) -> dict:
    """config.json as Nemotron 3 Nano publishes it: the layer pattern as
    ``hybrid_override_pattern`` with ``E`` for the mixture-of-experts layers (the converter
    reads the string or transformers 5's ``layers_block_type``; both give the same file), the
    mixture-of-experts keys kept (``num_experts_per_tok`` is what makes it nemotron_h_moe)."""
    hp = dict(hp)
    letters = {**_NEMOTRON_LETTERS, "moe": "E"}
    hp["hybrid_override_pattern"] = "".join(letters[t] for t in hp.pop("layers_block_type"))
    hp["num_hidden_layers"] = len(hp["hybrid_override_pattern"])
    assert "num_experts_per_tok" in hp and not hp.get("num_nextn_predict_layers")
    return hp


def nemotron_h_moe_params(w: Any, hp: dict, rope: dict) -> None:
    """``NemotronHModel.set_gguf_parameters`` with ``is_moe``: the non-MoE keys, then the
    per-layer feed-forward length ``moe_intermediate_size`` on the ``E`` layers only (0 on the
    dense ``-`` ones: the converter's MLP layers of a MoE model are its ``E`` layers), the
    expert counts and widths, ``norm_topk_prob`` as ``expert_weights_norm``,
    ``routed_scaling_factor`` as ``expert_weights_scale``, ``n_group`` as
    ``expert_group_count`` and ``moe_latent_size`` where set. (``topk_group`` reaches the file
    as the generic ``expert_group_used_count``.)"""
    nemotron_h_params(w, hp, rope)
    pattern = hp["hybrid_override_pattern"]
    w.add_feed_forward_length([hp["moe_intermediate_size"] if c == "E" else 0 for c in pattern])
    w.add_expert_used_count(hp["num_experts_per_tok"])
    w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(hp["moe_shared_expert_intermediate_size"])
    w.add_expert_count(hp["n_routed_experts"])
    w.add_expert_shared_count(hp["n_shared_experts"])
    w.add_expert_weights_norm(hp["norm_topk_prob"])
    w.add_expert_weights_scale(hp["routed_scaling_factor"])
    w.add_expert_group_count(hp["n_group"])
    if hp.get("moe_latent_size") is not None:
        w.add_moe_latent_size(hp["moe_latent_size"])


def nemotron_h_moe_modify(hp: dict) -> Any:
    """``NemotronHModel.modify_tensors`` with ``is_moe``: the Mamba-2 changes (by name), the
    stacked experts renamed ``model.layers.{bid}.mlp.experts.{up,down}_proj.weight`` (the
    selection bias, already ``e_score_correction.bias``, the router, shared expert and latent
    projections map by name), q / k permuted on the attention layers."""
    inner = nemotron_h_modify(hp)

    def modify(name: str, a: np.ndarray, _: dict) -> list[tuple[str, np.ndarray]]:
        bid = _layer(name)
        for proj in ("up_proj", "down_proj"):
            if name.endswith(f"mixer.experts.{proj}.weight"):
                return [(f"model.layers.{bid}.mlp.experts.{proj}.weight", a)]
        return inner(name, a, _)
    return modify


# ----------------------------------------------------------------------------------------
# qwen3next, qwen35, qwen35moe
# ----------------------------------------------------------------------------------------

def qwen3next_params(w: Any, hp: dict, rope: dict) -> None:
    """``Qwen3NextModel.set_gguf_parameters`` after the generic keys and Qwen2MoeModel's
    expert widths; ``partial_rotary_factor`` is looked up at the top level (transformers 5
    keeps it in ``rope_parameters``: the default 0.25 applies, the tiny configs' value)."""
    if hp.get("moe_intermediate_size") is not None:
        w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    if hp.get("shared_expert_intermediate_size") is not None:
        w.add_expert_shared_feed_forward_length(hp["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(hp["linear_conv_kernel_dim"])
    w.add_ssm_state_size(hp["linear_key_head_dim"])
    w.add_ssm_group_count(hp["linear_num_key_heads"])
    w.add_ssm_time_step_rank(hp["linear_num_value_heads"])
    w.add_ssm_inner_size(hp["linear_value_head_dim"] * hp["linear_num_value_heads"])
    w.add_full_attention_interval(hp.get("full_attention_interval", 4))
    rope_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    w.add_rope_dimension_count(int(rope_dim * hp.get("partial_rotary_factor", 0.25)))


def qwen35_params(w: Any, hp: dict, rope: dict) -> None:
    """``Qwen3_5TextModel`` / ``Qwen3_5MoeTextModel``: Qwen3-Next's keys, the M-RoPE sections
    (default [11, 11, 10, 0]: the tiny configs carry none), the MTP layer count."""
    qwen3next_params(w, hp, rope)
    if "mrope_section" not in rope:
        w.add_rope_dimension_sections([11, 11, 10, 0])
    if hp.get("mtp_num_hidden_layers", 0) > 0:
        w.add_nextn_predict_layers(hp["mtp_num_hidden_layers"])


def qwen3next_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``Qwen3NextModel.modify_tensors``: A = -exp(A_log), dt_bias as dt_proj.bias, the conv
    squeezed, the (1 + w) norms + 1 (not the gated norm), in_proj_qkvz split into attn_qkv
    ([q | k | v] over all key heads) and attn_gate (z)."""
    if name.endswith(".A_log"):
        a = -np.exp(a)
    elif name.endswith(".dt_bias"):
        name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
    elif "conv1d" in name:
        a = a.squeeze()
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        a = a + 1
    if "in_proj_qkvz.weight" in name:
        dk, dv = hp["linear_key_head_dim"], hp["linear_value_head_dim"]
        vh, kh, d = hp["linear_num_value_heads"], hp["linear_num_key_heads"], hp["hidden_size"]
        split = [dk, dk, vh // kh * dv, vh // kh * dv]
        t = a.T.reshape(d, kh, sum(split))
        q, k, v, z = np.split(t, np.cumsum(split)[:-1], axis=-1)
        flat = [x.reshape(d, -1) for x in (q, k, v, z)]
        bid = _layer(name)
        return [(f"blk.{bid}.attn_qkv.weight", np.concatenate(flat[:3], axis=-1).T),
                (f"blk.{bid}.attn_gate.weight", flat[3].T)]
    return [(name, a)]


def _reorder_v_heads(a: np.ndarray, dim: int, kh: int, r: int, hd: int) -> np.ndarray:
    """``_LinearAttentionVReorderBase._reorder_v_heads``: grouped -> tiled."""
    shape = list(a.shape)
    t = a.reshape(*shape[:dim], kh, r, hd, *shape[dim + 1:])
    return np.swapaxes(t, dim, dim + 1).reshape(shape)


def qwen35_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``_LinearAttentionVReorderBase.modify_tensors`` (value heads from grouped by key head
    to tiled, where there are more value heads than key heads), then Qwen3-Next's."""
    kh, vh = hp["linear_num_key_heads"], hp["linear_num_value_heads"]
    if kh != vh and "linear_attn." in name:
        dk, dv, r = hp["linear_key_head_dim"], hp["linear_value_head_dim"], vh // kh
        if ".in_proj_qkv." in name:
            qk = 2 * dk * kh
            a = np.concatenate([a[:qk], _reorder_v_heads(a[qk:], 0, kh, r, dv)])
        elif ".in_proj_z." in name:
            a = _reorder_v_heads(a, 0, kh, r, dv)
        elif ".in_proj_b." in name or ".in_proj_a." in name:
            a = _reorder_v_heads(a, 0, kh, r, 1)
        elif ".A_log" in name or ".dt_bias" in name:
            a = _reorder_v_heads(a[:, None], 0, kh, r, 1)[:, 0]
        elif ".conv1d" in name:
            data, qk = a.squeeze(), 2 * dk * kh
            a = np.concatenate([data[:qk], _reorder_v_heads(data[qk:], 0, kh, r, dv)])
        elif ".out_proj." in name:
            a = _reorder_v_heads(a, 1, kh, r, dv)
    return qwen3next_modify(name, a, hp)
