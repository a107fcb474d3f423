"""Parsers of the 2025 mixture-of-experts families whose attention is new: gpt-oss (attention
sinks, alternating sliding / full layers, clamped SwiGLU experts, yarn),
DeepSeek-V2 / V3 (multi-head latent attention, shared experts, group-limited routing, V3's
sigmoid scores with a selection bias) and Llama 4 text (chunked local attention, NoPE layers
with attention temperature tuning, weightless q/k norms after RoPE, interleaved MoE with the
routing weight on the expert's input), as transformers' ``GptOss*``, ``DeepseekV2*``,
``DeepseekV3*`` and ``Llama4*`` compute them.

Keys these families' published configs carry that the forward does not read are accepted at
their *neutral value* only (the value that leaves the numbers unchanged; any other value is a
``ConfigError`` naming the key, the value and the neutral one): :data:`NEUTRAL`, which the
registry adds to each family's ``neutral`` table (generated into docs/BACKENDS.md).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs

from mi_core.plugin import ConfigError

from mi_transformer.config.axes import (MlaConfig, MoeConfig, RopeConfig, RopeLayout,
                                        RopeScaling, TransformerConfig)
from mi_transformer.config.common import (_activation, _base, _finish, _layer_types,
                                          _partial_rotary, _ropes_by_type)
from mi_transformer.config.neutral import ROTARY_INTERLEAVED, policy_violations
from mi_transformer.config.reader import ConfigReader, UnknownKeysError
from mi_transformer.config.size import check_parsed, check_size

#: model_type -> {key: neutral value}: keys the forward does not read, accepted only at the
#: value that leaves it unchanged (transformers ignores them, or they describe what this
#: family always does); the registry adds them to the family's ``neutral`` table
#: (:mod:`mi_transformer.config.neutral`), with the rotary layout's ``rope_interleaved``.
NEUTRAL: dict[str, dict[str, Any]] = {
    "deepseek_v2": {"moe_layer_freq": 1, "scoring_func": "softmax", "norm_topk_prob": False,
                    "mlp_bias": False},
    "deepseek_v3": {"moe_layer_freq": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc"},
    "llama4_text": {"for_llm_compressor": False},
}


def _agree(r: ConfigReader, keys: tuple[str, ...], default: Any = None) -> Any:
    """One integer spelled several ways (transformers' attribute aliases, the original
    code's names): the spellings present must agree."""
    given = {k: v for k in keys if (v := r.int(k, None)) is not None}
    if len(set(given.values())) > 1:
        raise ConfigError(f"{r.src}: {' / '.join(given)} disagree: {given}")
    if not given and default is None:
        raise ConfigError(f"{r.src}: required field {keys[0]!r} is missing")
    return next(iter(given.values())) if given else default


# ----------------------------------------------------------------------------------------
# gpt-oss
# ----------------------------------------------------------------------------------------

#: transformers' GptOssConfig rope when the config gives none (yarn x32 over 4096 tokens)
_GPT_OSS_YARN = dict(scaling=RopeScaling.YARN, factor=32.0, beta_fast=32.0, beta_slow=1.0,
                     truncate=False, original_max_positions=4096)


def parse_gpt_oss(r: ConfigReader) -> TransformerConfig:
    """gpt-oss: GQA with biases and a learned sink logit per head, alternating sliding /
    full layers (``layer_types``), yarn RoPE, every MLP a mixture of experts (router with
    bias, softmax over the top-k logits, stacked experts with biases, gate / up interleaved,
    clamped SwiGLU). Its published MXFP4 experts are dequantized by the loader
    (:mod:`mi_transformer.quant`): the weight table is the dequantized one."""
    base = _base(r, "gpt_oss", eps_default=1e-5)
    r.read.add("hidden_act")  # transformers' gpt-oss never reads it: the experts' SwiGLU is fixed
    bias = r.bool("attention_bias", True)
    n = base["num_layers"]
    moe = MoeConfig(
        num_experts=_agree(r, ("num_local_experts", "num_experts")),
        top_k=_agree(r, ("num_experts_per_tok", "experts_per_token")),
        expert_size=base["intermediate_size"], norm_topk_prob=True, router_name="router",
        router_bias=True, fused="interleaved", expert_bias=True,
        swiglu_limit=r.float("swiglu_limit", 7.0, gt=0),
        swiglu_alpha=r.float("swiglu_alpha", 1.702, gt=0))
    base.update(qkv_bias=bias, o_bias=bias, attn_sinks=True, moe=moe, layer_moe=(True,) * n,
                norm_gain_float32=True,  # transformers: (w * norm(x.float())).to(x.dtype)
                norm_weights_float32=True)  # with w kept float32 (_keep_in_fp32_modules)
    ropes = _ropes_by_type(r)
    if not (r.has("rope_parameters") or r.has("rope_scaling")):
        theta = r.float("rope_theta", 150000.0, gt=0)
        ropes = dict.fromkeys(ropes, RopeConfig(theta=theta, **_GPT_OSS_YARN))  # type: ignore
    orig = r.int("initial_context_length", None)  # the original code's yarn length
    if orig is not None and orig != ropes["full_attention"].original_max_positions:
        raise ConfigError(f"{r.src}: initial_context_length = {orig} differs from the rope's "
                          f"original_max_position_embeddings "
                          f"{ropes['full_attention'].original_max_positions} (transformers "
                          f"reads the latter, the original code the former)")
    types = _layer_types(r, n, lambda i: bool((i + 1) % 2))
    return _finish(r, base, types, ropes, r.int("sliding_window", 128))


# ----------------------------------------------------------------------------------------
# DeepSeek-V2 / V3
# ----------------------------------------------------------------------------------------

#: transformers' class defaults (DeepseekV2Config / DeepseekV3Config) for keys a config omits
_DEEPSEEK_DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v2": dict(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64,
                        n_shared_experts=2, routed_scaling_factor=1.0, first_k_dense_replace=0,
                        moe_intermediate_size=1407),
    "deepseek_v3": dict(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256,
                        n_shared_experts=1, routed_scaling_factor=2.5, first_k_dense_replace=3,
                        moe_intermediate_size=2048, n_group=8, topk_group=4,
                        num_experts_per_tok=8),
}


def _mla(r: ConfigReader, defaults: dict[str, Any]) -> MlaConfig:
    q_rank = r.int("q_lora_rank", None) if "q_lora_rank" in r.cfg else defaults["q_lora_rank"]
    r.read.add("q_lora_rank")  # null: queries from one projection (DeepSeek-V2-Lite)
    mla = MlaConfig(kv_lora_rank=r.int("kv_lora_rank", defaults["kv_lora_rank"]),
                    nope_dim=r.int("qk_nope_head_dim", defaults["qk_nope_head_dim"]),
                    rope_dim=r.int("qk_rope_head_dim", defaults["qk_rope_head_dim"]),
                    v_head_dim=r.int("v_head_dim", defaults["v_head_dim"]), q_lora_rank=q_rank)
    # transformers writes head_dim = qk_rope_head_dim and qk_head_dim = nope + rope
    for key, value in (("head_dim", mla.rope_dim), ("qk_head_dim", mla.nope_dim + mla.rope_dim)):
        r.refuse_unless(key, value, f"transformers' DeepSeek derives it: it must be {value}")
    return mla


def _deepseek_moe(r: ConfigReader, model_type: str, defaults: dict[str, Any]) -> MoeConfig:
    v3 = model_type == "deepseek_v3"
    n_shared = r.int("n_shared_experts", defaults["n_shared_experts"], min=0)
    size = r.int("moe_intermediate_size", defaults["moe_intermediate_size"])
    experts = _agree(r, ("n_routed_experts", "num_local_experts" if v3 else "num_experts"),
                     defaults["n_routed_experts"])
    top_k = r.int("num_experts_per_tok", defaults.get("num_experts_per_tok"))
    check_size(r.src, {"n_routed_experts": experts, "moe_intermediate_size": size}, 0)
    if v3:  # sigmoid scores, a selection bias, groups scored by their best two experts
        groups = dict(n_group=r.int("n_group", defaults["n_group"]),
                      topk_group=r.int("topk_group", defaults["topk_group"]))
        route: dict[str, Any] = dict(
            scoring="sigmoid", norm_topk_prob=r.bool("norm_topk_prob", True),
            selection_bias="gate.e_score_correction_bias", **groups)
    else:
        method = r.str("topk_method", "greedy", choices=("greedy", "group_limited_greedy"))
        grouped = method == "group_limited_greedy"
        route = dict(norm_topk_prob=False, group_by_max=True, router_float32=True,
                     n_group=r.int("n_group") if grouped else 1,
                     topk_group=r.int("topk_group") if grouped else 1)
        r.int("n_group", None), r.int("topk_group", None)  # read even when greedy ignores them
    return MoeConfig(num_experts=experts, top_k=top_k, expert_size=size,
                     shared_expert_size=size * n_shared, shared_name="shared_experts",
                     routed_scaling=r.float("routed_scaling_factor",
                                            defaults["routed_scaling_factor"], gt=0),
                     accumulate_float32=True, **route)


def _deepseek(r: ConfigReader, model_type: str) -> TransformerConfig:
    """DeepSeek-V2 / V3: MLA attention, the first `first_k_dense_replace` MLPs dense, the rest
    MoE with shared experts."""
    defaults = _DEEPSEEK_DEFAULTS[model_type]
    mla = _mla(r, defaults)
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
    # Latent attention gives every head its own k and v (kv_b_proj's output is per head), so
    # num_key_value_heads cannot change the numbers: DeepSeek's code never reads it and
    # transformers' default (SDPA) path gives the same logits at any value (measured; its eager
    # path fails on a mismatch). Read for its type and range, then every head is a kv head.
    r.int("num_key_value_heads", heads, min=1)
    kv = heads
    n, vocab, inter = r.int("num_hidden_layers"), r.int("vocab_size"), r.int("intermediate_size")
    # before the per-layer tables below (a billion layers would exhaust memory building them)
    check_parsed(r, dict(vocab_size=vocab, hidden_size=hidden, num_layers=n, num_heads=heads,
                         num_kv_heads=kv, head_dim=mla.nope_dim + mla.rope_dim,
                         intermediate_size=inter),
                 ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "", "intermediate_size"))
    dense = r.int("first_k_dense_replace", defaults["first_k_dense_replace"], min=0)
    bias = r.bool("attention_bias", False)
    base: dict[str, Any] = dict(
        model_type=model_type, vocab_size=vocab, hidden_size=hidden, num_layers=n,
        num_heads=heads, num_kv_heads=kv, head_dim=mla.nope_dim + mla.rope_dim,
        intermediate_size=inter,
        norm_eps=r.float("rms_norm_eps", 1e-6, gt=0),
        activation=_activation(r, "hidden_act", "silu"),
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        max_positions=r.int("max_position_embeddings", None), rotary_dim=mla.rope_dim,
        mla=mla, qkv_bias=bias, o_bias=bias, moe=_deepseek_moe(r, model_type, defaults),
        layer_moe=tuple(i >= dense for i in range(n)),
        rope_layout=RopeLayout.INTERLEAVED if r.bool("rope_interleave", True)
        else RopeLayout.HALF)
    if model_type == "deepseek_v3":  # multi-token-prediction layers: stored after the others
        extra = r.int("num_nextn_predict_layers", 0, min=0)
        check_size(r.src, {"num_nextn_predict_layers": extra}, 0)  # a table of `extra` entries
        base["ignored_layers"] = tuple(range(n, n + extra))
    ropes = _ropes_by_type(r)
    if _partial_rotary(r, mla.rope_dim):
        raise ConfigError(f"{r.src}: partial_rotary_factor is not supported with latent "
                          f"attention (the rotary dims are qk_rope_head_dim)")
    base["attn_multiplier"] = _mla_scale(mla, ropes["full_attention"])
    return _finish(r, base, ["full_attention"] * n, ropes, None)


def _mla_scale(mla: MlaConfig, rope: RopeConfig) -> float:
    """transformers' softmax scale: (nope + rope)^-1/2, times mscale(factor, mscale_all_dim)^2
    under yarn with ``mscale_all_dim`` (``yarn_apply_mscale``)."""
    scale = (mla.nope_dim + mla.rope_dim) ** -0.5
    if rope.scaling is not RopeScaling.NONE and rope.mscale_all_dim and rope.factor > 1:
        m = 0.1 * rope.mscale_all_dim * math.log(rope.factor) + 1.0
        scale = scale * m * m
    return scale


def parse_deepseek_v2(r: ConfigReader) -> TransformerConfig:
    r.refuse_unless("rope_interleave", True, "DeepSeek-V2 always rotates interleaved pairs")
    return _deepseek(r, "deepseek_v2")


def parse_deepseek_v3(r: ConfigReader) -> TransformerConfig:
    return _deepseek(r, "deepseek_v3")


# ----------------------------------------------------------------------------------------
# Llama 4 (text)
# ----------------------------------------------------------------------------------------

def _flags(r: ConfigReader, key: str, n: int, default: Callable[[int], bool]) -> list[bool]:
    v = r.list(key)
    if v is None or v == []:  # transformers: an empty list means the default
        return [default(i) for i in range(n)]
    if len(v) < n or not all(f in (0, 1) and not isinstance(f, float) for f in v):
        raise r.bad(key, v, f"at least {n} entries of 0 or 1")
    return [bool(f) for f in v[:n]]


def _temperature_tuning(r: ConfigReader) -> bool:
    """``attn_temperature_tuning``: true / false, or the integer transformers 4.51 wrote (4 in
    the published Scout / Maverick configs), which it read as true when non-zero."""
    v = r.get("attn_temperature_tuning")
    if v is None:
        return True
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v >= 0:
        return v != 0
    raise r.bad("attn_temperature_tuning", v, "true, false or a non-negative integer")


def parse_llama4_text(r: ConfigReader) -> TransformerConfig:
    base = _base(r, "llama4_text", eps_default=1e-5)
    n = base["num_layers"]
    bias = r.bool("attention_bias", False)
    interval = r.int("no_rope_layer_interval", 4)
    use_rope = _flags(r, "no_rope_layers", n, lambda i: bool((i + 1) % interval))
    moe_layers = r.list("moe_layers")
    step = r.int("interleave_moe_layer_step", 1)
    if moe_layers is None:
        moe_layers = list(range(step - 1, n, step))
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in moe_layers):
        raise r.bad("moe_layers", moe_layers, f"a list of layer indices in 0..{n - 1}")
    expert = base["intermediate_size"]
    moe = MoeConfig(num_experts=r.int("num_local_experts", 16),
                    top_k=r.int("num_experts_per_tok", 1), expert_size=expert,
                    norm_topk_prob=False, shared_expert_size=expert, block="feed_forward",
                    router_name="router", scoring="sigmoid", weights_scale_input=True,
                    fused="concat")
    qk = r.bool("use_qk_norm", True)
    tuning = _temperature_tuning(r)
    base.update(intermediate_size=r.int("intermediate_size_mlp", 16384), weight_names="llama4",
                qkv_bias=bias, o_bias=bias, rope_layout=RopeLayout.INTERLEAVED, moe=moe,
                layer_moe=tuple(i in moe_layers for i in range(n)),
                layer_use_rope=tuple(use_rope), qk_norm=qk, qk_norm_after_rope=qk,
                qk_norm_affine=False, layer_qk_norm=tuple(use_rope) if qk else (),
                attn_temperature=(r.float("floor_scale", 8192.0, gt=0),
                                  r.float("attn_scale", 0.1)) if tuning else None)
    types = r.list("layer_types")
    if types is None:
        types = ["chunked_attention" if f else "full_attention" for f in use_rope]
    chunk = r.int("attention_chunk_size", 8192)
    if len(types) != n or not all(t in ("chunked_attention", "full_attention") for t in types):
        raise r.bad("layer_types", types, f"{n} entries of 'chunked_attention' / 'full_attention'")
    base["layer_chunks"] = tuple(chunk if t == "chunked_attention" else None for t in types)
    ropes = _ropes_by_type(r)
    if not r.has("rope_parameters") and not r.has("rope_theta"):
        ropes = {k: attrs.evolve(v, theta=500000.0) for k, v in ropes.items()}
    return _finish(r, base, ["full_attention"] * n, ropes, None)


#: Keys of the Llama 4 multimodal checkpoint that only matter with images.
_LLAMA4_MM_KEYS = {"vision_config", "boi_token_index", "eoi_token_index", "image_token_index"}


def parse_llama4(r: ConfigReader) -> TransformerConfig:
    """Llama 4 multimodal checkpoints (``model_type: llama4``, e.g. Llama-4-Scout): the
    language model inside, parsed from ``text_config`` as ``llama4_text``; text-only forward
    (the vision model and projector are not loaded)."""
    tc = r.mapping("text_config")
    if tc is None:
        raise ConfigError(f"{r.src}: llama4 config lacks 'text_config' (the language model)")
    sub = r.sub("text_config", tc)
    cfg = parse_llama4_text(sub)
    unknown = policy_violations(sub.cfg, sub.read, LLAMA4_HARMLESS,
                                {**ROTARY_INTERLEAVED, **NEUTRAL["llama4_text"]}, cfg, sub.src)
    if unknown:
        raise UnknownKeysError(f"{sub.src}: keys that change the numbers and are not "
                               f"implemented (or are unknown): {', '.join(unknown)}", unknown)
    r.read.update(_LLAMA4_MM_KEYS)
    tie = r.bool("tie_word_embeddings", cfg.tie_word_embeddings)
    return attrs.evolve(cfg, model_type="llama4", weight_names="llama4_mm",
                        tie_word_embeddings=tie)


# ----------------------------------------------------------------------------------------
# registration (config/registry.py adds these to FAMILIES)
# ----------------------------------------------------------------------------------------

_SHAPES = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings",
           "hidden_act", "tie_word_embeddings", "rms_norm_eps", "attention_bias",
           "use_bidirectional_attention"}
_ROPE_KEYS = {"rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
              "original_max_position_embeddings"}
_ROUTER_HARMLESS = {"output_router_logits", "router_aux_loss_coef", "router_jitter_noise"}
#: Llama 4 text keys that do not change the numbers (also inside a multimodal text_config)
LLAMA4_HARMLESS = frozenset(_ROUTER_HARMLESS | {"cache_implementation"})
_DEEPSEEK = _SHAPES | _ROPE_KEYS | {
    "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "qk_head_dim", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
    "moe_intermediate_size", "routed_scaling_factor", "first_k_dense_replace", "n_group",
    "topk_group", "rope_interleave"}
_LLAMA4 = _SHAPES | _ROPE_KEYS | {
    "intermediate_size_mlp", "num_local_experts", "num_experts_per_tok", "moe_layers",
    "interleave_moe_layer_step", "use_qk_norm", "no_rope_layers", "no_rope_layer_interval",
    "attention_chunk_size", "layer_types", "attn_temperature_tuning", "floor_scale",
    "attn_scale"}

#: (model_type, parser, keys read, keys known to be harmless, note)
MOE2_FAMILIES: list[tuple[str, Callable[[ConfigReader], TransformerConfig], set[str], set[str],
                          str]] = [
    ("gpt_oss", parse_gpt_oss, _SHAPES | _ROPE_KEYS | {
        "num_local_experts", "num_experts", "num_experts_per_tok", "experts_per_token",
        "swiglu_limit", "swiglu_alpha", "sliding_window", "layer_types",
        "initial_context_length"}, set(_ROUTER_HARMLESS),
     "attention sinks, sliding / full layers, clamped-SwiGLU experts, MXFP4 experts"),
    ("deepseek_v2", parse_deepseek_v2, _DEEPSEEK | {"topk_method", "num_experts"},
     {"aux_loss_alpha", "seq_aux", "ep_size", *_ROUTER_HARMLESS},
     "multi-head latent attention, shared experts, group-limited routing"),
    ("deepseek_v3", parse_deepseek_v3, _DEEPSEEK | {
        "norm_topk_prob", "num_local_experts", "num_nextn_predict_layers"},
     {"aux_loss_alpha", "seq_aux", "ep_size", *_ROUTER_HARMLESS},
     "MLA; sigmoid routing with a selection bias; MTP layers ignored"),
    ("llama4_text", parse_llama4_text, _LLAMA4, set(LLAMA4_HARMLESS),
     "chunked attention, NoPE layers with temperature tuning, q/k L2 norm, MoE"),
    ("llama4", parse_llama4, {"text_config", "tie_word_embeddings", *_LLAMA4_MM_KEYS}, set(),
     "multimodal checkpoint: the language model only"),
]
