"""Parsers of the hybrid families whose recurrent layers are linear attention: Qwen3-Next,
Qwen3.5 and OLMo hybrid (gated DeltaNet, mi-ssm's ``gated_deltanet`` mixer).

A layer is ``x + mixer(norm(x))`` (the mixer: gated DeltaNet or gated softmax attention),
then ``x + mlp(norm(x))``; the schedule comes from ``layer_types`` ("linear_attention" /
"full_attention"; absent: every ``full_attention_interval``-th layer is attention). The
attention layers are Qwen3's with an output gate (``attn_output_gate``: q_proj rows [q | gate]
per head), partial rotary (``partial_rotary_factor``, transformers' default 0.25), per-head
q/k norms; every norm is ``x / rms(x) * (1 + w)`` (:attr:`NormType.GEMMA_RMS`). Qwen3-Next's
MLP is a mixture of experts with a sigmoid-gated shared expert on the layers
``decoder_sparse_step`` / ``mlp_only_layers`` mark; Qwen3.5-MoE's on every layer (the same
block, always renormalised). Qwen3.5 as released is multimodal (``qwen3_5`` /
``qwen3_5_moe``: the language model's config under ``text_config``, its tensors under
``model.language_model.``): the language model is loaded and run text-only, as Gemma 3's
and Llama 4's (:func:`parse_qwen3_5`); its mRoPE keys are checked, not used
(:func:`_mrope`). OLMo hybrid's attention layers are
OLMo2's (post-norms only, full-width q/k norms, no rotary where ``rope_parameters`` is null,
as released), its DeltaNet layers pre-norm (``mixer_pre_norms``) with separate projections
and ``beta = 2 sigmoid(b)`` (``linear_allow_neg_eigval``). A family is this parser, its key table
(:data:`GATED_DELTA_KEYS`) and a weight-name table (``weights.NAME_TABLES``).
"""

from __future__ import annotations

from typing import Any

import attrs

from mi_core.plugin import ConfigError, UnsupportedModelError, mixer

from mi_transformer.config.axes import (ATTENTION, MixerConfig, NormType, Positions,
                                        TransformerConfig)
from mi_transformer.config.common import RopeExtra, _base, _finish, _ropes_by_type
from mi_transformer.config.families_moe import _moe, _sparse_layers
from mi_transformer.config.neutral import ROTARY, policy_violations
from mi_transformer.config.reader import ConfigReader, UnknownKeysError

#: Mixer setting -> config key (mi_ssm.gated_delta reads them); "layout" names the
#: checkpoint's projection layout (a value, not a key).
GATED_DELTA_KEYS: dict[str, str] = {
    "k_heads": "linear_num_key_heads", "v_heads": "linear_num_value_heads",
    "d_k": "linear_key_head_dim", "d_v": "linear_value_head_dim",
    "d_conv": "linear_conv_kernel_dim", "norm_eps": "rms_norm_eps", "act": "hidden_act"}
GATED_DELTA = "gated_deltanet"
#: transformers' layer_types spellings -> our layer types
_TYPES = {"linear_attention": GATED_DELTA, "full_attention": ATTENTION}


def _schedule(r: ConfigReader, n: int) -> tuple[str, ...]:
    """layer_types, or (transformers' rule without it) attention every interval-th layer."""
    types = r.list("layer_types")
    if types is None:
        every = r.int("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    elif r.has("full_attention_interval"):
        r.int("full_attention_interval")  # transformers ignores it when layer_types is given
    if len(types) != n:
        raise ConfigError(f"{r.src}: layer_types has {len(types)} entries, num_hidden_layers "
                          f"is {n}")
    bad = sorted({repr(t) for t in types if t not in _TYPES})
    if bad:
        raise ConfigError(f"{r.src}: layer_types has unsupported entries {bad} (supported: "
                          f"{sorted(_TYPES)})")
    return tuple(_TYPES[t] for t in types)


def _rotary_dims(r: ConfigReader, head_dim: int) -> int:
    """partial_rotary_factor (top level or in rope_parameters); transformers' default for
    these families is 0.25, not 1."""
    params = r.mapping("rope_parameters") or {}
    frac = r.float("partial_rotary_factor", None, gt=0, le=1)
    if frac is None and "partial_rotary_factor" in params:
        frac = r.sub("rope_parameters", params).float("partial_rotary_factor", gt=0, le=1)
    dims = int(head_dim * (0.25 if frac is None else frac))
    if dims < 2 or dims % 2:
        raise ConfigError(f"{r.src}: partial rotary factor {frac} of head_dim {head_dim} gives "
                          f"{dims} rotated dims (must be even and >= 2)")
    return 0 if dims == head_dim else dims


def _gated_delta_spec(r: ConfigReader, model_type: str) -> Any:
    try:
        return mixer(GATED_DELTA, f"{r.src}: model_type {model_type!r}")
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{exc}; the linear-attention mixers come with mi-ssm (pip "
                                    f"install 'mi-core[ssm]')") from None


def _mrope(rotary_dim: int) -> RopeExtra:
    """Qwen3.5's multimodal rotary keys inside the RoPE dict, accepted at the values that
    cannot change a text-only forward.

    transformers' ``Qwen3_5TextRotaryEmbedding`` gives every rotary frequency one of three
    position rows (temporal / height / width: interleaved, frequency j reads row j mod 3
    within the sections ``mrope_section``; Qwen2-VL's contiguous layout reads them in three
    runs). Text-only input has the three rows equal, each the token's position, so every
    frequency reads that position whatever the layout: plain rotary (proved on transformers'
    own modules in tests/ssm/test_ssm_linear_qwen35.py). The forward here is text-only, so
    the keys are checked, not used: ``mrope_section`` must be three non-negative integers
    splitting the rotary_dim / 2 frequencies (anything else is no mRoPE layout; transformers
    fails on fewer than three), ``mrope_interleaved`` a bool (either layout reduces alike)."""
    freqs = rotary_dim // 2

    def read(p: ConfigReader) -> None:
        sec = p.list("mrope_section")
        if sec is not None and (len(sec) != 3 or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sec)
                or sum(sec) != freqs):
            raise p.bad("mrope_section", sec, f"three non-negative integers summing to "
                        f"{freqs} (the temporal / height / width split of the {freqs} rotary "
                        f"frequencies of {rotary_dim} rotated dims)")
        p.bool("mrope_interleaved", None)
    return read


def _gated_delta_hybrid(r: ConfigReader, model_type: str, layout: str, extra: dict[str, Any],
                        weight_names: str = "qwen3_next", mrope: bool = False
                        ) -> TransformerConfig:
    base = _base(r, model_type)
    n, hidden = base["num_layers"], base["hidden_size"]
    spec = _gated_delta_spec(r, model_type)
    settings = spec.settings(r, {**GATED_DELTA_KEYS, "layout": layout}, hidden)
    # released Qwen3-Next configs say use_sliding_window: false; transformers has no window here
    r.refuse_unless("use_sliding_window", False, "full attention only (no sliding window)")
    bias = r.bool("attention_bias", False)
    rotary = _rotary_dims(r, base["head_dim"])
    base.update(qkv_bias=bias, o_bias=bias, qk_norm=True, attn_output_gate=True,
                weight_names=weight_names, norm_type=NormType.GEMMA_RMS, rotary_dim=rotary,
                layer_mixers=_schedule(r, n), mixers=(MixerConfig(GATED_DELTA, spec, settings),),
                **extra)
    ropes = _ropes_by_type(r, extra_keys=_mrope(rotary or base["head_dim"]) if mrope else None)
    return _finish(r, base, ["full_attention"] * n, ropes, None)


def parse_qwen3_next(r: ConfigReader) -> TransformerConfig:
    """Qwen3-Next: fused in_proj_qkvz / in_proj_ba; MoE with a gated shared expert."""
    n = r.int("num_hidden_layers")
    moe = _moe(r, ("num_experts",), "moe_intermediate_size", True, shared=True) \
        if r.int("num_experts", 0, min=0) else None
    if moe is None:  # no experts: the MoE keys transformers writes cannot change a number
        r.read.update({"num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                       "shared_expert_intermediate_size", "decoder_sparse_step",
                       "mlp_only_layers"})
    layer_moe = _sparse_layers(r, n) if moe is not None else ()
    return _gated_delta_hybrid(r, "qwen3_next", "fused", dict(moe=moe, layer_moe=layer_moe))


def parse_qwen3_5_text(r: ConfigReader) -> TransformerConfig:
    """Qwen3.5 (text): separate in_proj_qkv / z / b / a; a dense MLP."""
    return _gated_delta_hybrid(r, "qwen3_5_text", "separate", {}, "qwen3_5", mrope=True)


def parse_qwen3_5_moe_text(r: ConfigReader) -> TransformerConfig:
    """Qwen3.5-MoE (text): Qwen3.5's layers with Qwen3-Next's MoE (softmax top-k, always
    renormalised, a sigmoid-gated shared expert) on every layer. transformers' config has no
    ``intermediate_size`` (no dense MLP): absent, the experts' width stands in (unused)."""
    r.fallback = {"intermediate_size": r.int("moe_intermediate_size")}
    moe = _moe(r, ("num_experts",), "moe_intermediate_size", None, shared=True)
    n = r.int("num_hidden_layers")
    return _gated_delta_hybrid(r, "qwen3_5_moe_text", "separate",
                               dict(moe=moe, layer_moe=(True,) * n), "qwen3_5", mrope=True)


#: The multimodal wrapper's own keys (the vision tower and its token ids; the text-only
#: forward never reads them). ``language_model_only`` is a serving flag of the releases.
QWEN3_5_MM_KEYS = frozenset({"vision_config", "image_token_id", "video_token_id",
                             "vision_start_token_id", "vision_end_token_id",
                             "language_model_only"})


def _qwen3_5_wrapper(r: ConfigReader, model_type: str, text_type: str,
                     parse_text: Any, harmless: frozenset[str], neutral: dict[str, Any]
                     ) -> TransformerConfig:
    tc = r.mapping("text_config")
    if tc is None:
        raise ConfigError(f"{r.src}: {model_type} config lacks 'text_config' (the language "
                          f"model)")
    sub = r.sub("text_config", tc)
    inner = sub.str("model_type", None)
    if inner not in (None, text_type):  # transformers would parse it as text_type regardless
        raise ConfigError(f"{sub.src}: model_type = {inner!r} inside a {model_type!r} config; "
                          f"expected {text_type!r}")
    cfg = parse_text(sub)
    unknown = policy_violations(sub.cfg, sub.read, harmless, neutral, cfg, sub.src)
    if unknown:
        raise UnknownKeysError(f"{sub.src}: keys that change the numbers and are not "
                               f"implemented (or are unknown): {', '.join(unknown)}", unknown)
    r.read.update(QWEN3_5_MM_KEYS)
    # the wrapper's own flag decides (transformers' default False, not the text config's)
    tie = r.bool("tie_word_embeddings", False)
    return attrs.evolve(cfg, model_type=model_type, weight_names="qwen3_5_mm",
                        tie_word_embeddings=tie)


def parse_qwen3_5(r: ConfigReader) -> TransformerConfig:
    """Qwen3.5 as released (``Qwen3_5ForConditionalGeneration``): the language model of
    ``text_config`` (parsed as ``qwen3_5_text``), text-only; vision tower not loaded."""
    return _qwen3_5_wrapper(r, "qwen3_5", "qwen3_5_text", parse_qwen3_5_text,
                            QWEN3_5_HARMLESS, QWEN3_5_NEUTRAL)


def parse_qwen3_5_moe(r: ConfigReader) -> TransformerConfig:
    """Qwen3.5-MoE as released (``Qwen3_5MoeForConditionalGeneration``): the language model
    of ``text_config`` (parsed as ``qwen3_5_moe_text``), text-only."""
    return _qwen3_5_wrapper(r, "qwen3_5_moe", "qwen3_5_moe_text", parse_qwen3_5_moe_text,
                            QWEN3_5_MOE_HARMLESS, QWEN3_5_MOE_NEUTRAL)


#: OLMo hybrid's mixer keys (the gated norm's eps is FLA's fixed 1e-5: no key)
OLMO_HYBRID_KEYS: dict[str, str] = {
    **{k: v for k, v in GATED_DELTA_KEYS.items() if k != "norm_eps"},
    "neg_eigval": "linear_allow_neg_eigval"}


def parse_olmo_hybrid(r: ConfigReader) -> TransformerConfig:
    """OLMo hybrid: OLMo2 attention layers (post-norms) and pre-norm gated DeltaNet layers."""
    base = _base(r, "olmo_hybrid")
    n, hidden = base["num_layers"], base["hidden_size"]
    spec = _gated_delta_spec(r, "olmo_hybrid")
    settings = spec.settings(r, {**OLMO_HYBRID_KEYS, "layout": "olmo"}, hidden)
    params = r.mapping("rope_parameters")
    rope = bool(params) and params.get("rope_theta") is not None  # released: no rotary
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_full=True, pre_norms=False,
                post_norms=True, mixer_pre_norms=True, weight_names="olmo_hybrid",
                norm_gain_float32=True,  # transformers: (w * norm(x.float())).to(x.dtype)
                positions=Positions.ROPE if rope else Positions.NONE,
                layer_mixers=_schedule(r, n), mixers=(MixerConfig(GATED_DELTA, spec, settings),))
    return _finish(r, base, ["full_attention"] * n, _ropes_by_type(r), None)


_HYBRID = {"layer_types", "full_attention_interval", "attention_bias", "use_sliding_window",
           *GATED_DELTA_KEYS.values()}
QWEN3_NEXT_READS = frozenset(_HYBRID | {
    "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
    "mlp_only_layers"})
QWEN3_5_TEXT_READS = frozenset(_HYBRID)
QWEN3_5_MOE_TEXT_READS = frozenset(_HYBRID | {
    "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size"})
#: Qwen3.5's released text_config keys that transformers never reads: the multi-token-
#: prediction head (``mtp.*`` tensors, not part of the causal-LM forward, as in transformers).
QWEN3_5_HARMLESS = frozenset({"mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"})
QWEN3_5_MOE_HARMLESS = frozenset(QWEN3_5_HARMLESS | {
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise"})
#: ... and those at the one value transformers implements: the attention output gate is
#: always on; the recurrent state is kept in float32 (``mamba_ssm_dtype``, the releases'
#: "float32"); Qwen3.5-MoE always renormalises the top-k weights and has an MoE on every layer
#: (Qwen3-Next's keys for these, read by neither transformers nor us). The dense 27B's
#: text_config carries Qwen3-Next's ``mlp_only_layers: []`` too; a 2026 Qwen3.5-MoE export
#: names the gated norm's activation (``output_gate_type``, read by transformers' Qwen4-exp
#: only): swish, the silu transformers' Qwen3.5 always applies.
QWEN3_5_NEUTRAL: dict[str, Any] = {**ROTARY, "attn_output_gate": True,
                                   "mamba_ssm_dtype": "float32", "mlp_only_layers": [],
                                   "output_gate_type": "swish"}
QWEN3_5_MOE_NEUTRAL: dict[str, Any] = {**QWEN3_5_NEUTRAL, "norm_topk_prob": True,
                                       "decoder_sparse_step": 1}
OLMO_HYBRID_READS = frozenset(_HYBRID | {"linear_allow_neg_eigval"})
#: OLMo hybrid's initialisation-only keys (A_log / dt ranges at creation)
OLMO_HYBRID_HARMLESS = frozenset({"linear_a_log_min", "linear_a_log_max", "linear_dt_min",
                                  "linear_dt_max", "linear_dt_init_floor"})
