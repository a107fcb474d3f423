"""Parsers of the families of 2025-26 (LLaMA's key names, :func:`_base`): OLMo-3, EXAONE-4,
GLM-4 (``glm``, ``glm4``), GLM-4.5 (``glm4_moe``), ERNIE-4.5 (dense and MoE), Hunyuan dense,
Seed-OSS and Apertus; and the families refused by name with the reason (:data:`REFUSED`,
empty since Gemma-3n and Gemma-4 are supported: config/families_gemma.py).

Each parser starts from the defaults of the family's transformers config class where they
differ from :func:`_base`'s (:func:`_defaults`: a key absent or null takes the class default,
as transformers fills it in), and reads the keys a published checkpoint writes that the
transformers class never reads only at the value that leaves the forward unchanged
(:func:`_neutral`, data in ``_NEUTRAL``): any other value is a ``ConfigError`` naming the key,
the value and the neutral one.

:data:`RECENT_FAMILIES` is what the registry adds to ``FAMILIES``: (model_type, parser, keys
read beyond LLaMA's, keys known harmless, note).
"""

from __future__ import annotations

from typing import Any, Callable

from mi_core.plugin import ConfigError

from mi_transformer.config.axes import (Activation, MlpLayout, MoeConfig, RopeConfig,
                                        RopeLayout, TransformerConfig)
from mi_transformer.config.common import (_ACTIVATIONS, _LAYER_TYPE_KEYS, _base, _finish,
                                          _full, _layer_types, _rope, _ropes_by_type)
from mi_transformer.config.reader import ConfigReader


def _defaults(r: ConfigReader, defaults: dict[str, Any]) -> None:
    """The family's transformers defaults for keys absent (or null) in the file."""
    merged = dict(r.cfg)
    for k, v in defaults.items():
        if merged.get(k) is None:
            merged[k] = v
    r.cfg = merged


def _neutral(r: ConfigReader, model_type: str) -> None:
    """Keys the transformers class never reads, accepted at their neutral value only."""
    for key, value in _NEUTRAL.get(model_type, {}).items():
        r.refuse_unless(key, value, f"transformers' {model_type} has no such option: its "
                                    f"forward is the one {key} = {value!r} describes")


#: model_type -> {key: the value at which the forward is the one implemented}. Keys published
#: checkpoints carry (from the model's original code) that transformers' class ignores.
_NEUTRAL: dict[str, dict[str, Any]] = {
    "hunyuan_v1_dense": {"use_qk_norm": True, "use_rotary_pos_emb": True, "use_cla": False,
                         "use_mla": False, "num_experts": 1, "norm_type": "rms",
                         "mlp_bias": False, "add_classification_head": False},
    # (GLM-4.5-Air derivatives also name an MoE on every layer past first_k_dense_replace
    # and the float32 router transformers' Glm4Moe always computes)
    "glm4_moe": {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "decoder_sparse_step": 1,
                 "moe_router_dtype": "float32"},
    "ernie4_5_moe": {"use_rmsnorm": True, "moe_use_aux_free": True},
    "apertus": {"qk_norm": True, "post_norm": False, "mlp_bias": False},
}


def _no_window_key(r: ConfigReader, default: int) -> int | None:
    """``sliding_window``: the class default when absent, None (full attention) when null."""
    if "sliding_window" not in r.cfg:
        r.read.add("sliding_window")
        return default
    return r.int("sliding_window", None)


# ----------------------------------------------------------------------------------------
# OLMo-3, EXAONE-4: per-layer sliding / full attention (layer_types)
# ----------------------------------------------------------------------------------------

def _per_type_ropes(r: ConfigReader, default_theta: float) -> dict[str, RopeConfig]:
    """OLMo-3's ropes: transformers 5's nested ``rope_parameters`` (one per layer type), or
    the hub's ``rope_theta`` + ``rope_scaling``, where the scaling applies to the full
    attention layers only and the sliding ones use the plain base (``Olmo3Config``)."""
    max_pos = r.int("max_position_embeddings", None)
    theta = r.float("rope_theta", default_theta, gt=0)
    params = r.mapping("rope_parameters")
    if params is not None:
        sub = r.sub("rope_parameters", params)
        extra = sorted(set(params) - set(_LAYER_TYPE_KEYS))
        if extra:
            raise ConfigError(f"{sub.src}: keys {extra} are not understood (expected one rope "
                              f"per layer type: {', '.join(_LAYER_TYPE_KEYS)})")
        return {k: _rope(sub, k, theta, max_pos) if sub.mapping(k) is not None
                else RopeConfig(theta=theta) for k in _LAYER_TYPE_KEYS}
    full = _rope(r, "rope_scaling", theta, max_pos, r.int("original_max_position_embeddings",
                                                          None))
    return {"full_attention": full, "sliding_attention": RopeConfig(theta=theta)}


def parse_olmo3(r: ConfigReader) -> TransformerConfig:
    """OLMo-3: OLMo2 (post-norms only, full-width q/k norms) with sliding-window layers
    (``layer_types``; default three sliding then one full), RoPE scaling on full layers."""
    base = _base(r, "olmo3", eps_default=1e-5)
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_full=True, pre_norms=False,
                post_norms=True, weight_names="olmo2", rope_float32=True,
                norm_gain_float32=True)  # transformers: (w * norm(x.float())).to(x.dtype)
    window = _no_window_key(r, 4096)
    types = _layer_types(r, base["num_layers"], lambda i: (i + 1) % 4 != 0)
    return _finish(r, base, types, _per_type_ropes(r, 500_000.0), window)


def parse_exaone4(r: ConfigReader) -> TransformerConfig:
    """EXAONE-4: post-norms only, per-head q/k RMS norms; with a sliding window, the sliding
    layers use RoPE and the full ones none (NoPE); without one, every layer uses RoPE."""
    base = _base(r, "exaone4", eps_default=1e-5)
    base.update(qk_norm=True, pre_norms=False, post_norms=True, weight_names="olmo2")
    window = _no_window_key(r, 4096)
    pattern = r.get("sliding_window_pattern")
    n = base["num_layers"]
    if r.list("layer_types") is None:
        if window is None:
            raise ConfigError(f"{r.src}: exaone4 config without sliding_window needs "
                              f"layer_types (transformers cannot build them either)")
        if pattern is None:
            pattern = 4
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise r.bad("sliding_window_pattern", pattern,
                        "an integer >= 1 (a string pattern needs layer_types beside it)")
    types = _layer_types(r, n, lambda i: (i + 1) % pattern != 0)
    if window is not None:  # NoPE on the full-attention layers
        base["layer_use_rope"] = tuple(t == "sliding_attention" for t in types)
    return _finish(r, base, types, _ropes_by_type(r), window)


# ----------------------------------------------------------------------------------------
# GLM-4 (glm, glm4), GLM-4.5 (glm4_moe)
# ----------------------------------------------------------------------------------------

def _glm_partial_default(r: ConfigReader) -> None:
    """GLM's classes default partial_rotary_factor to 0.5 (unless rope_parameters says)."""
    params = r.mapping("rope_parameters") or {}
    if "partial_rotary_factor" not in params:
        _defaults(r, {"partial_rotary_factor": 0.5})


def _glm_base(r: ConfigReader, model_type: str) -> dict[str, Any]:
    _defaults(r, {"head_dim": 128, "num_key_value_heads": 2, "rms_norm_eps": 1.5625e-07,
                  "attention_bias": True})
    _glm_partial_default(r)
    base = _base(r, model_type)
    base.update(qkv_bias=r.bool("attention_bias"), mlp_layout=MlpLayout.GATED_FUSED,
                rope_layout=RopeLayout.INTERLEAVED)
    return base


def parse_glm(r: ConfigReader) -> TransformerConfig:
    """GLM-4 (``glm``): LLaMA with q/k/v biases (no output bias), fused gate/up MLP and
    interleaved partial rotary (half of each head by default)."""
    return _full(r, _glm_base(r, "glm"))


def parse_glm4(r: ConfigReader) -> TransformerConfig:
    """GLM-4-0414 (``glm4``): ``glm`` plus RMS norms on the attention and MLP outputs."""
    base = _glm_base(r, "glm4")
    base.update(post_norms=True, weight_names="glm4")
    return _full(r, base)


def parse_glm4_moe(r: ConfigReader) -> TransformerConfig:
    """GLM-4.5 (``glm4_moe``): rotate-half partial rotary, optional per-head q/k norms, the
    first ``first_k_dense_replace`` layers dense, then MoE with sigmoid scores, a selection
    bias, group-limited routing, routed scaling and shared experts. Published checkpoints'
    multi-token-prediction layers (after the last) are ignored."""
    _defaults(r, {"rms_norm_eps": 1e-5, "moe_intermediate_size": 1408,
                  "num_experts_per_tok": 8, "n_shared_experts": 1, "routed_scaling_factor": 1.0,
                  "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                  "norm_topk_prob": True})
    _glm_partial_default(r)
    _neutral(r, "glm4_moe")
    base = _base(r, "glm4_moe")
    n = base["num_layers"]
    experts = _agreeing(r, ("n_routed_experts", "num_local_experts"), 128)
    shared = r.int("n_shared_experts")
    size = r.int("moe_intermediate_size")
    moe = MoeConfig(num_experts=experts, top_k=r.int("num_experts_per_tok"), expert_size=size,
                    norm_topk_prob=r.bool("norm_topk_prob"), shared_expert_size=size * shared,
                    scoring="sigmoid", selection_bias="gate.e_score_correction_bias",
                    n_group=r.int("n_group"), topk_group=r.int("topk_group"),
                    routed_scaling=r.float("routed_scaling_factor", gt=0),
                    shared_name="shared_experts", accumulate_float32=True)
    dense = r.int("first_k_dense_replace", min=0)
    mtp = _agreeing(r, ("num_nextn_predict_layers", "num_mtp_layers"), 1, minimum=0)
    base.update(qkv_bias=r.bool("attention_bias", False), qk_norm=r.bool("use_qk_norm", False),
                moe=moe, layer_moe=tuple(i >= dense for i in range(n)),
                ignored_layers=tuple(range(n, n + mtp)))
    return _full(r, base)


def _agreeing(r: ConfigReader, keys: tuple[str, ...], default: int, minimum: int = 1) -> int:
    """One integer under several spellings (transformers' attribute_map); they must agree."""
    given = {k: v for k in keys if (v := r.int(k, None, min=minimum)) is not None}
    if len(set(given.values())) > 1:
        raise ConfigError(f"{r.src}: {' and '.join(given)} disagree: {given}")
    return next(iter(given.values()), default)


# ----------------------------------------------------------------------------------------
# ERNIE-4.5 (dense, MoE)
# ----------------------------------------------------------------------------------------

def _ernie_base(r: ConfigReader, model_type: str, kv: int) -> dict[str, Any]:
    # the dense class defaults head_dim to 128; the MoE class has no head_dim field and its
    # attention reads getattr(config, "head_dim", hidden // heads)
    defaults = {"num_key_value_heads": kv, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
    if model_type == "ernie4_5":
        defaults["head_dim"] = 128
    _defaults(r, defaults)
    base = _base(r, model_type)
    bias = r.bool("use_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, mlp_bias=bias, rope_layout=RopeLayout.INTERLEAVED,
                rope_float32=True)
    return base


def parse_ernie4_5(r: ConfigReader) -> TransformerConfig:
    """ERNIE-4.5 dense: LLaMA with interleaved rotary and biases everywhere but the head
    when ``use_bias``."""
    return _full(r, _ernie_base(r, "ernie4_5", 2))


def parse_ernie4_5_moe(r: ConfigReader) -> TransformerConfig:
    """ERNIE-4.5 MoE: softmax router whose choice adds a bias (``moe_statics``), weights
    renormalised by max(sum, moe_norm_min), shared experts; MoE layers every
    ``moe_layer_interval`` from ``moe_layer_start_index`` to ``moe_layer_end_index``."""
    _defaults(r, {"moe_intermediate_size": 1536, "moe_num_shared_experts": 2,
                  "moe_layer_start_index": 1, "moe_layer_interval": 1, "moe_norm_min": 1e-12})
    _neutral(r, "ernie4_5_moe")
    base = _ernie_base(r, "ernie4_5_moe", 4)
    # use_bias (no published MoE checkpoint sets it): transformers' Ernie4_5_Moe then gives
    # biases to attention, the dense and shared-expert MLPs and the head; the routed experts
    # have none
    bias = base["mlp_bias"]
    n = base["num_layers"]
    size = r.int("moe_intermediate_size")
    moe = MoeConfig(num_experts=_agreeing(r, ("moe_num_experts", "num_experts"), 64),
                    top_k=_agreeing(r, ("moe_k", "num_experts_per_tok"), 6), expert_size=size,
                    norm_topk_prob=True,
                    shared_expert_size=size * r.int("moe_num_shared_experts", min=0),
                    selection_bias="moe_statics.e_score_correction_bias",
                    selection_bias_rows=True, norm_min=r.float("moe_norm_min", gt=0),
                    shared_name="shared_experts", shared_expert_bias=bias)
    start, step = r.int("moe_layer_start_index", min=0), r.int("moe_layer_interval")
    end = r.int("moe_layer_end_index", -1, min=-1)
    end = n - 1 if end == -1 else end
    base.update(moe=moe, weight_names="ernie4_5_moe", lm_head_bias=bias,
                layer_moe=tuple((i + 1) % step == 0 and start <= i <= end for i in range(n)))
    return _full(r, base)


# ----------------------------------------------------------------------------------------
# Hunyuan dense, Seed-OSS, Apertus
# ----------------------------------------------------------------------------------------

#: Hunyuan keys that only matter when a neutral flag above is not neutral (cross-layer
#: attention, MLA, experts, classification head) or that name special tokens.
_HUNYUAN_UNUSED = {"cla_share_factor", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                   "qk_rope_head_dim", "moe_topk", "moe_intermediate_size", "num_shared_expert",
                   "moe_layer_num_skipped", "moe_drop_tokens", "moe_random_routing_dropped_token",
                   "group_limited_greedy", "n_group", "topk_group", "routed_scaling_factor",
                   "norm_topk_prob", "class_num", "pool_type", "skip_cls", "dense_list",
                   "eod_token_id", "pad_id", "im_start_id", "im_end_id", "im_newline_id",
                   "text_start_id", "text_end_id", "image_token_id", "mask_init_id",
                   "position_embedding_xdrop", "anyres_pooling_size", "anyres_vit_max_image_size",
                   "anyres_vit_two_views", "sliding_window"}


def _hunyuan_rope(r: ConfigReader, head_dim: int) -> dict[str, RopeConfig]:
    """NTK-alpha RoPE: a ``dynamic`` rope dict with ``alpha`` is a fixed base
    theta * alpha^(d / (d - 2)) over the whole head (transformers' ``ntk_alpha``; the dict's
    other keys are not read); anything else as LLaMA."""
    key = "rope_parameters" if r.has("rope_parameters") else "rope_scaling"
    params = r.mapping(key) or {}
    kind = params.get("rope_type") or params.get("type")
    if kind != "dynamic" or params.get("alpha") is None:
        return _ropes_by_type(r)
    p = r.sub(key, params)
    top = r.float("rope_theta", 10000.0, gt=0)
    theta = p.float("rope_theta", top, gt=0)
    alpha = p.float("alpha", gt=0)
    if head_dim < 3:
        raise ConfigError(f"{r.src}: NTK-alpha RoPE needs head_dim > 2")
    rope = RopeConfig(theta=theta * alpha ** (head_dim / (head_dim - 2)))
    r.read.update({"rope_parameters", "rope_scaling", "original_max_position_embeddings"})
    return {"full_attention": rope, "sliding_attention": rope}


def parse_hunyuan_v1_dense(r: ConfigReader) -> TransformerConfig:
    """Hunyuan dense: LLaMA with per-head q/k RMS norms applied *after* RoPE
    (``query_layernorm`` / ``key_layernorm``) and NTK-alpha RoPE."""
    _defaults(r, {"rms_norm_eps": 1e-5})
    _neutral(r, "hunyuan_v1_dense")
    base = _base(r, "hunyuan_v1_dense")
    r.refuse_unless("attention_head_dim", base["head_dim"], "it must equal head_dim")
    bias = r.bool("attention_bias", False)
    r.read.update(_HUNYUAN_UNUSED)
    base.update(qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_after_rope=True,
                weight_names="hunyuan")
    types = ["full_attention"] * base["num_layers"]
    return _finish(r, base, types, _hunyuan_rope(r, base["head_dim"]), None)


def parse_seed_oss(r: ConfigReader) -> TransformerConfig:
    """Seed-OSS: LLaMA with q/k/v biases (``attention_bias``, default on) and a separate
    output-projection bias (``attention_out_bias``)."""
    _defaults(r, {"head_dim": 128, "attention_bias": True, "attention_out_bias": False})
    base = _base(r, "seed_oss")
    base.update(qkv_bias=r.bool("attention_bias"), o_bias=r.bool("attention_out_bias"),
                mlp_bias=r.bool("mlp_bias", False))
    return _full(r, base)


#: ApertusConfig's RoPE when the file gives neither rope_parameters nor rope_scaling.
_APERTUS_ROPE = {"rope_type": "llama3", "rope_theta": 12_000_000.0, "factor": 8.0,
                 "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0}


def parse_apertus(r: ConfigReader) -> TransformerConfig:
    """Apertus: a plain (ungated) MLP with xIELU, its parameters learned per layer
    (``mlp.act_fn.alpha_p`` / ``alpha_n`` / ``beta`` / ``eps``), per-head q/k RMS norms,
    norms named ``attention_layernorm`` / ``feedforward_layernorm``."""
    _defaults(r, {"rms_norm_eps": 1e-5, "hidden_act": "xielu"})
    _neutral(r, "apertus")
    if r.get("rope_parameters") is None and r.get("rope_scaling") is None:
        _defaults(r, {"rope_parameters": dict(_APERTUS_ROPE)})
    xielu = r.str("hidden_act", choices={*_ACTIVATIONS, "xielu"}) == "xielu"
    if xielu:  # _base knows the stateless activations only; the learned one is set below
        r.cfg = {**r.cfg, "hidden_act": "silu"}
    base = _base(r, "apertus")
    if xielu:
        base["activation"] = Activation.XIELU
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, qk_norm=True, mlp_layout=MlpLayout.PLAIN,
                weight_names="apertus")
    return _full(r, base)


# ----------------------------------------------------------------------------------------
# Refused by name
# ----------------------------------------------------------------------------------------

#: model_type -> why the transformer backend refuses it (first line of the error).
REFUSED: dict[str, str] = {}


#: (model_type, parser, keys read beyond LLaMA's, family keys known harmless, note).
RECENT_FAMILIES: list[tuple[str, Callable[[ConfigReader], TransformerConfig], set[str],
                            set[str], str]] = [
    ("olmo3", parse_olmo3, {"sliding_window", "layer_types"}, set(),
     "OLMo2 with sliding-window layers (layer_types); RoPE scaling on full layers"),
    # (EXAONE-4.5's text_config carries Qwen2's max_window_layers, which transformers'
    # Exaone4 never reads: layer_types / sliding_window_pattern decide the windows)
    ("exaone4", parse_exaone4, {"sliding_window", "sliding_window_pattern", "layer_types"},
     {"max_window_layers"}, "post-norms, per-head q/k norms; NoPE on full layers when sliding"),
    ("glm", parse_glm, set(), set(), "fused gate/up, interleaved partial rotary, q/k/v bias"),
    ("glm4", parse_glm4, set(), set(), "glm plus post-norms on attention and MLP"),
    ("glm4_moe", parse_glm4_moe, {
        "moe_intermediate_size", "num_experts_per_tok", "n_shared_experts", "n_routed_experts",
        "num_local_experts", "routed_scaling_factor", "n_group", "topk_group",
        "first_k_dense_replace", "norm_topk_prob", "use_qk_norm", "num_nextn_predict_layers",
        "num_mtp_layers", *_NEUTRAL["glm4_moe"]}, {"output_router_logits", "router_aux_loss_coef"},
     "sigmoid router, selection bias, groups, shared experts; MTP layers ignored"),
    ("ernie4_5", parse_ernie4_5, {"use_bias"}, set(), "interleaved rotary, use_bias"),
    ("ernie4_5_moe", parse_ernie4_5_moe, {
        "use_bias", "moe_intermediate_size", "moe_num_shared_experts", "moe_layer_start_index",
        "moe_layer_end_index", "moe_layer_interval", "moe_norm_min", "moe_num_experts",
        "num_experts", "moe_k", "num_experts_per_tok", *_NEUTRAL["ernie4_5_moe"]},
     {"output_router_logits", "router_aux_loss_coef", "num_nextn_predict_layers",
      "multi_token_pred_lambda", "moe_capacity", "moe_gate"},
     "softmax router with selection bias, shared experts; MTP modules ignored"),
    ("hunyuan_v1_dense", parse_hunyuan_v1_dense, {
        "attention_head_dim", *_HUNYUAN_UNUSED, *_NEUTRAL["hunyuan_v1_dense"]}, set(),
     "q/k norms after RoPE, NTK-alpha RoPE"),
    ("seed_oss", parse_seed_oss, {"attention_out_bias"}, {"residual_dropout"},
     "q/k/v and output biases set apart"),
    ("apertus", parse_apertus, set(_NEUTRAL["apertus"]), set(),
     "xIELU plain MLP, per-head q/k norms"),
]
