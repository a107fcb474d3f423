"""What llama.cpp's converter writes for the GGUF architectures ``falcon-h1``, ``lfm2`` and
``lfm2moe``, redone with the `gguf` package's GGUFWriter through
:func:`tests.support.gguf_convert.write`, independently of mi_transformer.gguf (whose inverse
mapping the tests check against it).

Followed: ggml-org/llama.cpp ``conversion/``: ``falcon_h1.py`` @ 7bca1fd9
(``FalconH1Model``: its ``find_hparam`` with the ``mamba_`` prefixes, ``modify_tensors``'
multiplier folding, ``set_gguf_parameters``), ``mamba.py`` @ 32e9e044
(``Mamba2Model.set_gguf_parameters``, ``modify_tensors``), ``lfm2.py`` @ 051139f5
(``LFM2Model``: ``_add_feed_forward_length``, the per-layer KV heads, the squeezed conv;
``LFM2MoeModel``: the expert bias renamed ``expert_bias.bias``, the experts merged
[experts, rows, cols] under ``layers.{bid}.feed_forward.experts.{w}.weight``; the same
keys and tensors as @ 7bca1fd9), ``base.py`` @ 00bd27a6 (``TextModel.set_gguf_parameters``:
:func:`gguf_convert._generic`, whose rms epsilon is ``find_hparam(["rms_norm_eps",
"norm_eps"])``). The llama.cpp side read for what the file means: ``src/models/falcon-h1.cpp``
(NeoX rope, no permutation; ``blk.N.ffn_norm`` without suffix), ``src/models/lfm2.cpp`` (the
final norm ``LLM_TENSOR_OUTPUT_NORM_LFM2`` = ``token_embd_norm``; the MoE renormalised and
scaled by ``expert_weights_scale`` only). The converters read ``config.json``; each function
says which hparams it sees.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def _layer(name: str) -> int | None:
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


# ----------------------------------------------------------------------------------------
# falcon-h1
# ----------------------------------------------------------------------------------------

def falcon_h1_hparams(hp: dict) -> dict:
    """config.json as the hub's Falcon-H1 ship it: ``rope_theta`` at the top level
    (``FalconH1Model.set_gguf_parameters`` reads it with ``find_hparam``; transformers 5
    saves it under ``rope_parameters``)."""
    hp = dict(hp)
    hp.setdefault("rope_theta", (hp.get("rope_parameters") or {}).get("rope_theta"))
    return hp


def _find(hp: dict, keys: list[str]) -> Any:
    """``FalconH1Model.find_hparam``: the keys, then the same keys prefixed ``mamba_``."""
    for k in keys + [f"mamba_{k}" for k in keys]:
        if k in hp:
            return hp[k]
    return None


def falcon_h1_params(w: Any, hp: dict, rope: dict) -> None:
    """``Mamba2Model.set_gguf_parameters`` (through FalconH1's ``find_hparam``), then
    ``FalconH1Model.set_gguf_parameters``' overrides (the writer keeps the last value of a
    key written twice)."""
    d_inner = _find(hp, ["mamba_d_ssm", "intermediate_size", "d_inner"])
    head_dim = _find(hp, ["mamba_d_head", "head_dim"]) or 64
    w.add_context_length(2**20)
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(hp["num_hidden_layers"])
    w.add_ssm_conv_kernel(_find(hp, ["conv_kernel", "d_conv"]) or 4)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(_find(hp, ["state_size", "d_state"]) or 128)
    w.add_ssm_time_step_rank(d_inner // head_dim)
    w.add_ssm_group_count(_find(hp, ["n_groups"]) or 1)
    w.add_layer_norm_rms_eps(_find(hp, ["layer_norm_epsilon", "rms_norm_eps"]) or 1e-5)
    # FalconH1Model.set_gguf_parameters
    w.add_vocab_size(hp["vocab_size"])
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp.get("max_position_embeddings", 0))
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp["num_key_value_heads"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_rope_freq_base(_find(hp, ["rope_theta"]))


def _mamba2_layout(name: str, t: torch.Tensor, n_group: int, d_inner: int
                   ) -> tuple[str, torch.Tensor]:
    """``Mamba2Model.modify_tensors``: dt_bias as dt_proj.bias, the conv squeezed, A and D
    [heads, 1], the gated norm [groups, d_inner / groups], A = -exp(A_log)."""
    if name.endswith(".dt_bias"):
        name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
    if name.endswith("conv1d.weight"):
        t = t.squeeze()
    elif name.endswith((".A_log", ".D")):
        t = t.reshape(*t.shape, 1)
    elif name.endswith("mamba.norm.weight"):
        t = t.reshape(n_group, d_inner // n_group)
    if name.endswith(".A_log"):
        t = -torch.exp(t)
    return name, t


def falcon_h1_fold(name: str, t: torch.Tensor, hp: dict) -> torch.Tensor:
    """The multiplier folding of ``FalconH1Model.modify_tensors`` (on the checkpoint's name),
    in its order and float32 arithmetic."""
    mlp = hp["mlp_multipliers"]
    if "down_proj" in name:
        return t * mlp[1]
    if "gate_proj" in name:
        return t * mlp[0]
    if "k_proj" in name:
        return t * hp["key_multiplier"] * hp["attention_in_multiplier"]
    if "q_proj" in name or "v_proj" in name:
        return t * hp["attention_in_multiplier"]
    if "o_proj" in name:
        return t * hp["attention_out_multiplier"]
    if "out_proj" in name:
        return t * hp["ssm_out_multiplier"]
    if "in_proj" in name:
        t = t * hp["ssm_in_multiplier"]
        z, d_ssm = hp["ssm_multipliers"], hp["mamba_d_ssm"]
        gs = hp["mamba_n_groups"] * hp["mamba_d_state"]
        bounds = [0, d_ssm, 2 * d_ssm, 2 * d_ssm + gs, 2 * d_ssm + 2 * gs, t.shape[0]]
        for k in range(5):  # t[a:b, :] *= z[k]: 2-D, as the converter indexes it
            t[bounds[k]:bounds[k + 1], :] *= z[k]
        return t
    if "lm_head" in name:
        return t * hp["lm_head_multiplier"]
    if "embed_tokens" in name:
        return t * hp["embedding_multiplier"]
    return t


def falcon_h1_modify(hp: dict) -> Any:
    """``FalconH1Model.modify_tensors``: Mamba2Model's changes, then the multipliers folded
    into the tensors (named by the checkpoint's name)."""
    n_group, d_inner = hp["mamba_n_groups"], hp["mamba_d_ssm"]

    def modify(name: str, a: np.ndarray, _: dict) -> list[tuple[str, np.ndarray]]:
        new, t = _mamba2_layout(name, torch.from_numpy(a.copy()), n_group, d_inner)
        return [(new, falcon_h1_fold(name, t, hp).numpy())]
    return modify


# ----------------------------------------------------------------------------------------
# lfm2, lfm2moe
# ----------------------------------------------------------------------------------------

def lfm2_hparams(hp: dict) -> dict:
    """``LFM2Model`` / ``LFM2MoeModel.set_gguf_parameters``' first step: the KV heads per
    layer (0 on "conv" layers), which the generic keys then write as an array."""
    hp = dict(hp)
    hp["num_key_value_heads"] = [hp["num_key_value_heads"] if t != "conv" else 0
                                 for t in hp["layer_types"]]
    return hp


def _lfm2_ff(hp: dict) -> int:
    """``LFM2Model._add_feed_forward_length`` (@ 051139f5: block_ff_dim, else
    intermediate_size, which transformers 5's config has instead)."""
    ff = hp.get("block_ff_dim", hp["intermediate_size"])
    if hp["block_auto_adjust_ff_dim"]:
        ff = int(2 * ff / 3)
        if hp["block_ffn_dim_multiplier"] is not None:
            ff = int(hp["block_ffn_dim_multiplier"] * ff)
        multiple = hp["block_multiple_of"]
        ff = multiple * ((ff + multiple - 1) // multiple)
    return ff


def lfm2_params(w: Any, hp: dict, rope: dict) -> None:
    """``LFM2Model.set_gguf_parameters`` after the generic keys."""
    w.add_vocab_size(hp["vocab_size"])
    w.add_shortconv_l_cache(hp["conv_L_cache"])
    w.add_layer_norm_rms_eps(hp["norm_eps"])
    w.add_feed_forward_length(_lfm2_ff(hp))


def lfm2moe_params(w: Any, hp: dict, rope: dict) -> None:
    """``LFM2MoeModel.set_gguf_parameters`` after the generic keys (whose rms epsilon is
    ``norm_eps``: written here, as :func:`gguf_convert._generic` reads only
    ``rms_norm_eps``)."""
    import gguf

    w.add_layer_norm_rms_eps(hp["norm_eps"])
    w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    w.add_leading_dense_block_count(hp["num_dense_layers"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_vocab_size(hp["vocab_size"])
    w.add_shortconv_l_cache(hp["conv_L_cache"])


def lfm2_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``LFM2Model`` / ``LFM2MoeModel.modify_tensors``: the conv kernel squeezed (dim 1);
    ``filter_tensors``' expert bias renamed ``expert_bias.bias``; the merged experts under
    the name the converter maps (``layers.{bid}.feed_forward.experts.{w}.weight``). The
    converter's ``squeeze(1)`` raises on the conv's 1-D bias (``conv_bias: true``, which no
    released LFM2 has): that bias is written as it is, as another writer would."""
    if "conv.conv" in name and a.ndim == 3:
        a = a.squeeze(1)
    if name.endswith(".expert_bias"):
        name = name.replace(".expert_bias", ".expert_bias.bias")
    if ".feed_forward.experts." in name:
        name = name.removeprefix("model.")
    return [(name, a)]
