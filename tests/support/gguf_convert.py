"""What llama.cpp's converter writes for the GGUF architectures of issue 21's new families,
redone here with the `gguf` package's GGUFWriter, independently of mi_transformer.gguf (whose
inverse mapping the tests check against it).

Followed: ggml-org/llama.cpp ``conversion/`` (the split ``convert_hf_to_gguf.py``):
``base.py`` @ 00bd27a6 (``TextModel.set_gguf_parameters``, ``filter_tensors``: the
selection bias renamed ``e_score_correction.bias``), ``llama.py`` @ 0274f0fc
(``LlamaModel``: vocab size, rotary width, llama3 ``rope_freqs``), ``glm.py`` @ 051139f5
(``Glm4Model``, ``Glm4MoeModel``), ``ernie.py`` @ 051139f5 (``Ernie4_5MoeModel``),
``hunyuan.py`` @ 051139f5 (``HunYuanModel``), ``apertus.py`` @ 2bbcf7fc (``ApertusModel``),
``deepseek.py`` @ 01a723dc (``DeepseekV2Model``), ``gpt_oss.py`` @ 2bbcf7fc
(``GptOssModel``: nibble layout, MXFP4 repacking, the gate / up split; its yarn keys as the
generic ``TextModel`` writes them, with ``beta_fast`` / ``beta_slow``, which that commit's own
``set_gguf_parameters`` leaves out), ``llama4.py`` @ 2bbcf7fc and the monolithic
``convert_hf_to_gguf.py``'s ``Llama4Model.modify_tensors`` (the gate / up split),
``mamba.py`` @ 32e9e044, ``jamba.py`` @ 7bca1fd9. Each function below names the converter
method it redoes. Names come from ``gguf.get_tensor_name_map``; experts
are stacked [experts, rows, cols] per projection as the converters' expert merging does.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from tests.support.byte_tokens import gpt2_byte_tokens


def hparams(cfg: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hparams, rope_parameters) as ``TextModel.__init__`` sees a transformers 5 config."""
    hp = cfg.to_dict()
    rope = dict(hp.get("rope_parameters") or hp.get("rope_scaling") or {})
    return hp, rope


def _generic(w: Any, hp: dict[str, Any], rope: dict[str, Any], block_count: int) -> None:
    """``TextModel.set_gguf_parameters`` (the keys these families' configs reach)."""
    w.add_block_count(block_count)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    if hp.get("intermediate_size") is not None:
        w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    if hp.get("num_key_value_heads") is not None:
        w.add_head_count_kv(hp["num_key_value_heads"])
    rp = rope.get("full_attention", rope)
    kind = rp.get("rope_type")
    if kind == "yarn" and rp.get("factor") is not None:
        import gguf

        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rp["factor"])
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        if rp.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(rp["beta_fast"])
        if rp.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(rp["beta_slow"])
    if rp.get("rope_theta") is not None:
        w.add_rope_freq_base(rp["rope_theta"])
    if hp.get("rms_norm_eps") is not None:
        w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    n_exp = hp.get("num_local_experts", hp.get("num_experts"))
    if n_exp is not None:
        w.add_expert_count(n_exp)
    if hp.get("num_experts_per_tok") is not None:
        w.add_expert_used_count(hp["num_experts_per_tok"])
    if hp.get("n_group") is not None:
        w.add_expert_group_count(hp["n_group"])
    if hp.get("topk_group") is not None:
        w.add_expert_group_used_count(hp["topk_group"])
    score = hp.get("scoring_func")
    if score is not None:
        import gguf

        w.add_expert_gating_func({"sigmoid": gguf.ExpertGatingFuncType.SIGMOID,
                                  "softmax": gguf.ExpertGatingFuncType.SOFTMAX}[score])
    if hp.get("head_dim") is not None:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])


def _llama_params(w: Any, hp: dict[str, Any]) -> None:
    """``LlamaModel.set_gguf_parameters`` after the generic keys."""
    w.add_vocab_size(hp["vocab_size"])
    w.add_rope_dimension_count(hp.get("head_dim") or hp["hidden_size"]
                               // hp["num_attention_heads"])


def llama3_rope_freqs(hp: dict[str, Any], rope: dict[str, Any]) -> np.ndarray | None:
    """``LlamaModel.generate_extra_tensors``: llama3 factors (its original length is the
    *top-level* ``original_max_position_embeddings``, default 8192)."""
    rp = rope.get("full_attention", rope)
    if rp.get("rope_type", "").lower() != "llama3":
        return None
    base = rp.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rp.get("factor", 8.0), rp.get("low_freq_factor", 1.0), \
        rp.get("high_freq_factor", 4.0)
    old = hp.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


Tensors = dict[str, np.ndarray]
Modify = Callable[[str, np.ndarray, dict[str, Any]], list[tuple[str, np.ndarray]]]


def _stack_experts(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The converters' expert merging: ``...experts.{e}.{proj}.weight`` -> one
    ``...experts.{proj}.weight`` [experts, rows, cols]."""
    out: dict[str, torch.Tensor] = {}
    per: dict[str, dict[int, torch.Tensor]] = {}
    for name, t in sd.items():
        m = re.fullmatch(r"(.*\.experts)\.(\d+)\.(\w+)\.weight", name)
        if m:
            per.setdefault(f"{m[1]}.{m[3]}.weight", {})[int(m[2])] = t
        else:
            out[name] = t
    for name, experts in per.items():
        out[name] = torch.stack([experts[e] for e in sorted(experts)])
    return out


def write(out: Path, arch: str, cfg: Any, sd: dict[str, torch.Tensor], *,
          block_count: int | None = None, params: Callable[[Any, dict, dict], None] | None = None,
          modify: Modify | None = None, extra: Tensors | None = None,
          raw: dict[str, tuple[np.ndarray, Any]] | None = None, generic: bool = True,
          hp: dict[str, Any] | None = None,
          vocab: Callable[[Any, dict[str, Any]], None] | None = None) -> Path:
    """A GGUF of `arch` from the checkpoint `sd` (float tensors, HF names) and config `cfg`,
    in the converter's order (``ModelBase.write``: tensors, then metadata): every tensor
    renamed by ``TextModel.filter_tensors``, passed through `modify(name, array, hparams)`
    (returning ``[(HF-style or GGUF name, array)]``; default: unchanged) and mapped by gguf's
    tensor map, `extra` tensors under their GGUF names, `raw` GGUF name -> (bytes, ggml
    type) as is (MXFP4 blocks); then the generic metadata (unless not `generic`: Mamba's
    converters write their own), `params(writer, hparams, rope)` and the tokenizer (GPT-2's
    byte alphabet). `hp`: the hparams the converter reads when they are not `cfg.to_dict()`
    (config.json as published, where transformers 5 spells it otherwise). `vocab(writer,
    hparams)`: the tokenizer metadata when not GPT-2's byte alphabet."""
    import gguf

    if hp is None:
        hp, rope = hparams(cfg)
    else:
        rope = dict(hp.get("rope_parameters") or hp.get("rope_scaling") or {})
    n = block_count or hp["num_hidden_layers"]
    model_arch = next(a for a, s in gguf.MODEL_ARCH_NAMES.items() if s == arch)
    names = gguf.get_tensor_name_map(model_arch, n)
    w = gguf.GGUFWriter(str(out), arch)
    for name, t in _stack_experts(sd).items():
        if name.endswith("e_score_correction_bias"):  # TextModel.filter_tensors
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        a = t.float().numpy()
        for new, arr in (modify(name, a, hp) if modify is not None else [(name, a)]):
            gname = new if new.startswith(("blk.", "token_embd", "output", "rope_")) else \
                names.get_name(new, try_suffixes=(".weight", ".bias"))
            assert gname is not None, new
            w.add_tensor(gname, np.ascontiguousarray(arr, dtype=np.float32))
    for gname, arr in (extra or {}).items():
        w.add_tensor(gname, np.ascontiguousarray(arr, dtype=np.float32))
    for gname, (data, qtype) in (raw or {}).items():
        w.add_tensor(gname, data, raw_dtype=qtype)
    if generic:
        _generic(w, hp, rope, n)
    if params is not None:
        params(w, hp, rope)
    if vocab is not None:
        vocab(w, hp)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(gpt2_byte_tokens(hp["vocab_size"]))
        w.add_token_types([1] * hp["vocab_size"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _skip_tied(name: str, a: np.ndarray, hp: dict[str, Any]) -> list[tuple[str, np.ndarray]]:
    if name == "lm_head.weight" and hp.get("tie_word_embeddings"):
        return []
    return [(name, a)]


# ----------------------------------------------------------------------------------------
# the 2025-26 families
# ----------------------------------------------------------------------------------------

def glm4_params(w: Any, hp: dict, rope: dict) -> None:
    """``Glm4Model.set_gguf_parameters``: the rotary width, partial (default 0.5)."""
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    w.add_rope_dimension_count(int(dim * rope.get("partial_rotary_factor", 0.5)))


def glm4_moe_params(w: Any, hp: dict, rope: dict) -> None:
    """``Glm4MoeModel.set_gguf_parameters``."""
    import gguf

    glm4_params(w, hp, rope)
    w.add_expert_count(hp["n_routed_experts"])
    w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    w.add_expert_shared_count(hp["n_shared_experts"])
    w.add_leading_dense_block_count(hp["first_k_dense_replace"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(hp["routed_scaling_factor"])
    w.add_expert_weights_norm(hp["norm_topk_prob"])
    w.add_nextn_predict_layers(hp["num_nextn_predict_layers"])


def ernie4_5_moe_params(w: Any, hp: dict, rope: dict) -> None:
    """``Ernie4_5MoeModel.set_gguf_parameters``."""
    w.add_expert_count(hp["moe_num_experts"])
    w.add_expert_used_count(hp["moe_k"])
    w.add_interleave_moe_layer_step(hp["moe_layer_interval"])
    w.add_leading_dense_block_count(hp["moe_layer_start_index"])
    w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    shared = hp["moe_num_shared_experts"]
    w.add_expert_shared_count(shared)
    if shared > 0:
        w.add_expert_shared_feed_forward_length(hp["intermediate_size"]
                                                // hp["num_key_value_heads"])


def hunyuan_dense_params(w: Any, hp: dict, rope: dict) -> None:
    """``HunYuanModel.set_gguf_parameters``: NTK-alpha RoPE written as its scaled base (the
    converter asserts base 10000 and a 32k / 256k context, which the tiny config has)."""
    import gguf

    if rope.get("rope_type") != "dynamic":
        return
    alpha, base, dim = rope.get("alpha", 50), rope.get("rope_theta", 10000.0), hp["head_dim"]
    assert base == 10000.0 and hp["max_position_embeddings"] in (32 * 1024, 256 * 1024)
    w.add_rope_freq_base(base * (alpha ** (dim / (dim - 2))))
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    w.add_rope_scaling_factor(1)
    w.add_rope_scaling_orig_ctx_len(256 * 1024)
    w.add_context_length(256 * 1024)


def apertus(n_layers: int) -> tuple[Modify, Callable[[Any, dict, dict], None]]:
    """``ApertusModel`` (a ``LlamaModel`` without the q/k permutation): (modify, params).
    ``modify_tensors`` takes each layer's xIELU parameters out of the tensors; once every
    layer's is seen they are written as the metadata arrays ``xielu.*`` (raw values)."""
    seen: dict[str, dict[int, float]] = {}

    def modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.act_fn\.(alpha_n|alpha_p|beta|eps)", name)
        if m:
            seen.setdefault(m[2], {})[int(m[1])] = float(a.reshape(-1)[0])
            return []
        return [(name, a)]

    def params(w: Any, hp: dict, rope: dict) -> None:
        _llama_params(w, hp)
        values = {k: [v[i] for i in sorted(v)] for k, v in seen.items() if len(v) == n_layers}
        w.add_xielu_alpha_n(values["alpha_n"])
        w.add_xielu_alpha_p(values["alpha_p"])
        w.add_xielu_beta(values["beta"])
        w.add_xielu_eps(values["eps"])
    return modify, params


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """``LlamaModel.permute``."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def olmo_params(w: Any, hp: dict, rope: dict) -> None:
    """``OlmoModel.set_gguf_parameters``."""
    w.add_layer_norm_eps(1e-5)
    if hp.get("clip_qkv") is not None:
        w.add_clamp_kqv(hp["clip_qkv"])


def olmo_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``OlmoModel.modify_tensors``: q / k *weights* permuted."""
    if name.endswith("q_proj.weight"):
        a = _permute(a, hp["num_attention_heads"])
    if name.endswith("k_proj.weight"):
        a = _permute(a, hp["num_key_value_heads"])
    return [(name, a)]


def llama_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``LlamaModel.modify_tensors`` (undo_permute): q / k weights and biases permuted."""
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        a = _permute(a, hp["num_attention_heads"])
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        a = _permute(a, hp["num_key_value_heads"])
    return [(name, a)]


def llama_params(w: Any, hp: dict, rope: dict) -> None:
    """``LlamaModel.set_gguf_parameters`` (SmolLM3Model adds nothing)."""
    _llama_params(w, hp)


# ----------------------------------------------------------------------------------------
# DeepSeek-V2 / V3
# ----------------------------------------------------------------------------------------

def deepseek2_params(w: Any, hp: dict, rope: dict) -> None:
    """``DeepseekV2Model.set_gguf_parameters`` (after the generic keys, written with
    ``num_key_value_heads`` = 1)."""
    w.add_head_count_kv(1)
    w.add_leading_dense_block_count(hp.get("first_k_dense_replace") or 0)
    kv_lora = hp.get("kv_lora_rank", 512)
    w.add_vocab_size(hp["vocab_size"])
    if hp.get("q_lora_rank") is not None:
        w.add_q_lora_rank(hp["q_lora_rank"])
    w.add_kv_lora_rank(kv_lora)
    w.add_key_length(kv_lora + hp["qk_rope_head_dim"])
    w.add_value_length(kv_lora)
    w.add_key_length_mla(hp["qk_nope_head_dim"] + hp["qk_rope_head_dim"])
    w.add_value_length_mla(hp["v_head_dim"])
    w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    w.add_expert_count(hp["n_routed_experts"])
    w.add_expert_shared_count(hp.get("n_shared_experts", 0))
    if hp.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(hp["routed_scaling_factor"])
    if hp.get("norm_topk_prob"):
        w.add_expert_weights_norm(hp["norm_topk_prob"])
    w.add_rope_dimension_count(hp["qk_rope_head_dim"])
    if rope.get("mscale_all_dim") is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def deepseek2_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``DeepseekV2Model.modify_tensors``: kv_b split per head into k_b (transposed) and v_b."""
    if name == "lm_head.weight" and hp.get("tie_word_embeddings"):
        return []
    if name.endswith("kv_b_proj.weight"):
        h, v, nope = hp["num_key_value_heads"], hp["v_head_dim"], hp["qk_nope_head_dim"]
        kv_b = a.reshape(h, v + nope, a.shape[-1])
        k_b, v_b = kv_b[:, :nope], kv_b[:, nope:]
        return [(name.replace("kv_b_proj", "k_b_proj"), k_b.transpose(0, 2, 1)),
                (name.replace("kv_b_proj", "v_b_proj"), v_b)]
    return [(name, a)]


# ----------------------------------------------------------------------------------------
# gpt-oss
# ----------------------------------------------------------------------------------------

def gpt_oss_params(w: Any, hp: dict, rope: dict) -> None:
    """``GptOssModel.set_gguf_parameters``."""
    w.add_sliding_window(hp["sliding_window"])
    w.add_expert_feed_forward_length(hp["intermediate_size"])


def gpt_oss_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``GptOssModel.filter_tensors`` / ``modify_tensors`` for a checkpoint whose experts are
    not MXFP4 (sinks get ``.weight``; gate_up transposed and split even / odd; down
    transposed)."""
    if name.endswith("sinks"):
        return [(name + ".weight", a)]
    if "down_proj" in name:
        if name.endswith("_bias"):
            return [(name.replace("down_proj_bias", "down_proj.bias"), a)]
        if "_blocks" in name or "_scales" in name:
            return []  # repacked as MXFP4 (gpt_oss_mxfp4)
        return [(name.replace("down_proj", "down_proj.weight"), a.swapaxes(-1, -2))]
    if "gate_up_proj" in name:
        if name.endswith("_bias"):
            return [(name.replace("gate_up_proj_bias", "gate_proj.bias"), a[..., ::2]),
                    (name.replace("gate_up_proj_bias", "up_proj.bias"), a[..., 1::2])]
        if "_blocks" in name or "_scales" in name:
            return []
        t = a.swapaxes(-1, -2)
        return [(name.replace("gate_up_proj", "gate_proj.weight"), t[:, ::2, :]),
                (name.replace("gate_up_proj", "up_proj.weight"), t[:, 1::2, :])]
    return [(name, a)]


def _nibble_layout(t: torch.Tensor) -> torch.Tensor:
    """``GptOssModel.transform_nibble_layout``, line for line."""
    t_lo, t_hi = t & 0x0F, t & 0xF0
    t = (t_lo << 4) | (t_hi >> 4)
    blk_a, blk_b = t.chunk(2, dim=-1)
    blk_a0, blk_a1 = (blk_a & 0xF0).view(-1, 1), (blk_a << 4).view(-1, 1)
    blk_a = torch.stack((blk_a0, blk_a1), dim=2).view(t.shape)
    blk_b0, blk_b1 = (blk_b >> 4).view(-1, 1), (blk_b & 0x0F).view(-1, 1)
    blk_b = torch.stack((blk_b0, blk_b1), dim=2).view(t.shape)
    out = blk_a | blk_b
    return ((out & 0xF0) >> 4) | ((out & 0x0F) << 4)


def gpt_oss_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """``GptOssModel.repack_mxfp4``: HF's blocks [E, rows, groups, 16] and E8M0 scales
    [E, rows, groups] -> ggml MXFP4 bytes [E, rows, groups * 17]."""
    data = torch.concat((scales.unsqueeze(-1), _nibble_layout(blocks)), dim=-1)
    return data.view(data.shape[0], data.shape[1], -1).numpy()


def gpt_oss_mxfp4_experts(layer: int, gate_up: tuple[torch.Tensor, torch.Tensor],
                          down: tuple[torch.Tensor, torch.Tensor]
                          ) -> dict[str, tuple[np.ndarray, Any]]:
    """``GptOssModel.generate_extra_tensors``: one layer's MXFP4 experts (blocks, scales),
    gate_up split into its even (gate) and odd (up) rows."""
    import gguf

    q = gguf.GGMLQuantizationType.MXFP4
    (gb, gs), (db, ds) = gate_up, down
    return {f"blk.{layer}.ffn_gate_exps.weight": (gpt_oss_mxfp4(gb[:, ::2], gs[:, ::2]), q),
            f"blk.{layer}.ffn_up_exps.weight": (gpt_oss_mxfp4(gb[:, 1::2], gs[:, 1::2]), q),
            f"blk.{layer}.ffn_down_exps.weight": (gpt_oss_mxfp4(db, ds), q)}


# ----------------------------------------------------------------------------------------
# Llama 4
# ----------------------------------------------------------------------------------------

def llama4_params(w: Any, hp: dict, rope: dict) -> None:
    """``Llama4Model.set_gguf_parameters`` (its ``__init__`` swaps the two MLP widths:
    feed_forward_length is the dense MLP's, written here over the generic one)."""
    _llama_params(w, hp)
    w.add_feed_forward_length(hp["intermediate_size_mlp"])
    w.add_interleave_moe_layer_step(hp["interleave_moe_layer_step"])
    w.add_expert_feed_forward_length(hp["intermediate_size"])
    if "layer_types" in hp and all(t == "full_attention" for t in hp["layer_types"]):
        w.add_sliding_window(0)


def llama4_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``Llama4Model.modify_tensors``: gate_up transposed and split in halves, down
    transposed."""
    if "gate_up_proj" in name:
        t = a.swapaxes(-1, -2)
        half = t.shape[-2] // 2
        return [(name.replace("gate_up_proj", "gate_proj.weight"), t[..., :half, :]),
                (name.replace("gate_up_proj", "up_proj.weight"), t[..., half:, :])]
    if name.endswith("down_proj"):
        return [(name + ".weight", a.swapaxes(-1, -2))]
    return [(name, a)]


def skip_tied(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``HunYuanModel.modify_tensors``: the tied head not written."""
    return _skip_tied(name, a, hp)


# ----------------------------------------------------------------------------------------
# Mamba, Falcon-Mamba, Mamba-2
# ----------------------------------------------------------------------------------------

def mamba_params(w: Any, hp: dict, rope: dict) -> None:
    """``MambaModel.set_gguf_parameters`` (its hparams are config.json's, not AutoConfig's)."""
    d_model = hp["hidden_size"]
    d_inner = hp.get("intermediate_size") or 2 * d_model
    assert d_inner == 2 * d_model  # the converter fails early otherwise
    w.add_context_length(2**20)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(hp["num_hidden_layers"])
    w.add_ssm_conv_kernel(hp.get("conv_kernel") or 4)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(hp.get("state_size") or 16)
    w.add_ssm_time_step_rank(hp.get("time_step_rank") or -(d_model // -16))
    w.add_layer_norm_rms_eps(hp.get("layer_norm_epsilon") or 1e-5)
    w.add_ssm_dt_b_c_rms(hp.get("model_type") == "falcon_mamba")


def mamba_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``MambaModel.modify_tensors``: A = -exp(A_log), the conv squeezed."""
    if name.endswith(".A_log"):
        a = -np.exp(a)
    if name.endswith("conv1d.weight"):
        a = a.squeeze()
    return [(name, a)]


def mamba2_params(w: Any, hp: dict, rope: dict) -> None:
    """``Mamba2Model.set_gguf_parameters``."""
    d_model = hp["hidden_size"]
    d_inner = hp.get("mamba_d_ssm") or hp.get("intermediate_size") or hp.get("d_inner") \
        or 2 * d_model
    head_dim = hp.get("mamba_d_head") or hp.get("head_dim") or 64
    assert d_inner == 2 * d_model and d_inner % head_dim == 0
    w.add_context_length(2**20)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(hp["num_hidden_layers"])
    w.add_ssm_conv_kernel(hp.get("conv_kernel") or 4)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(hp.get("state_size") or 128)
    w.add_ssm_time_step_rank(d_inner // head_dim)
    w.add_ssm_group_count(hp.get("n_groups") or 1)
    w.add_layer_norm_rms_eps(hp.get("layer_norm_epsilon") or 1e-5)


def mamba2_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``Mamba2Model.modify_tensors``: dt_bias as dt_proj.bias, the conv squeezed, A and D
    [heads, 1], the gated norm [groups, d_inner / groups], A = -exp(A_log)."""
    if name.endswith(".dt_bias"):
        name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
    if name.endswith("conv1d.weight"):
        a = a.squeeze()
    elif name.endswith((".A_log", ".D")):
        a = a.reshape(*a.shape, 1)
    elif name.endswith("mixer.norm.weight"):
        groups = hp.get("n_groups") or 1
        a = a.reshape(groups, a.size // groups)
    if name.endswith(".A_log"):
        a = -np.exp(a)
    return [(name, a)]


def jamba_params(w: Any, hp: dict, rope: dict) -> None:
    """``JambaModel.set_gguf_parameters`` (conversion/jamba.py @ 7bca1fd9): the attention
    layers as the per-layer KV head count (0 on Mamba layers)."""
    d_model = hp["hidden_size"]
    offset, period, n = hp["attn_layer_offset"], hp["attn_layer_period"], hp["num_hidden_layers"]
    kv = [0] * offset + [hp["num_key_value_heads"] if (i - offset) % period == 0 else 0
                         for i in range(offset, n)]
    w.add_block_count(n)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(kv)
    w.add_ssm_conv_kernel(hp.get("mamba_d_conv") or 4)
    w.add_ssm_inner_size(hp["mamba_expand"] * d_model)
    w.add_ssm_state_size(hp.get("mamba_d_state") or 16)
    w.add_ssm_time_step_rank(hp.get("mamba_dt_rank") or -(d_model // -16))
    w.add_layer_norm_rms_eps(hp.get("rms_norm_eps") or 1e-6)
    w.add_expert_count(hp["num_experts"])
    w.add_expert_used_count(hp["num_experts_per_tok"])


def jamba_modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
    """``JambaModel.modify_tensors``: experts (stacked by :func:`write`) named as Qwen2-MoE's,
    A = -exp(A_log), the conv squeezed."""
    name = name.replace(".moe.", ".feed_forward.")
    if ".feed_forward.experts." in name:  # "using the same merged name as qwen2moe"
        name = name.replace(".feed_forward.experts.", ".mlp.experts.")
    if name.endswith("conv1d.weight"):
        a = a.squeeze()
    if name.endswith(".A_log"):
        a = -np.exp(a)
    return [(name, a)]
