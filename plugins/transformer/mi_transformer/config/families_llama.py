"""Parsers of the LLaMA-like families (LLaMA's key names, :func:`_base`): LLaMA, Helium,
Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, StarCoder2, and those with twists: OLMo, OLMo2,
Granite, SmolLM3, Cohere."""

from __future__ import annotations

import math
from typing import Any

import attrs

from mi_core.plugin import ConfigError

from mi_transformer.config.axes import (BlockLayout, MlpLayout, NormType, QkvLayout,
                                        RopeLayout, TransformerConfig)
from mi_transformer.config.common import (_activation, _all_sliding, _base, _default_theta,
                                          _finish, _full, _layer_types, _ropes_by_type)
from mi_transformer.config.neutral import ROTARY, policy_violations
from mi_transformer.config.reader import ConfigReader, UnknownKeysError


# ----------------------------------------------------------------------------------------
# LLaMA, Helium, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, StarCoder2
# ----------------------------------------------------------------------------------------

def parse_llama(r: ConfigReader) -> TransformerConfig:
    base = _base(r, "llama")
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, mlp_bias=r.bool("mlp_bias", False))
    return _full(r, base)


def parse_helium(r: ConfigReader) -> TransformerConfig:
    """LLaMA arithmetic with GPT-J's interleaved rotary layout."""
    base = _base(r, "helium")
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, mlp_bias=r.bool("mlp_bias", False),
                rope_layout=RopeLayout.INTERLEAVED,
                norm_gain_float32=True)  # transformers: (w.float() * norm(x.float())).to(x.dtype)
    return _full(r, base)


def parse_mistral(r: ConfigReader) -> TransformerConfig:
    return _all_sliding(r, _base(r, "mistral"))


def _qwen(r: ConfigReader, base: dict[str, Any]) -> TransformerConfig:
    window = r.int("sliding_window", None) if r.bool("use_sliding_window", False) else None
    r.read.add("sliding_window")  # present but unused when use_sliding_window is false
    mwl = r.int("max_window_layers", 0, min=0)
    types = _layer_types(r, base["num_layers"], lambda i: window is not None and i >= mwl)
    return _finish(r, base, types, _ropes_by_type(r), window)


def parse_qwen2(r: ConfigReader) -> TransformerConfig:
    base = _base(r, "qwen2")
    base.update(qkv_bias=True)
    return _qwen(r, base)


def parse_qwen3(r: ConfigReader) -> TransformerConfig:
    base = _base(r, "qwen3")
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, qk_norm=True)
    return _qwen(r, base)


#: Keys of Gemma 2 / Gemma 3 configs known not to change the numbers (the registry's
#: `harmless` of gemma2 and gemma3_text; here too, for the text_config inside gemma3).
_GEMMA_HARMLESS = frozenset({"cache_implementation"})


def _gemma_base(r: ConfigReader, model_type: str) -> dict[str, Any]:
    base = _base(r, model_type, tie_default=True)
    act = "hidden_activation" if r.has("hidden_activation") else "hidden_act"
    r.read.update({"hidden_activation", "hidden_act"})
    bias = r.bool("attention_bias", False)
    base.update(norm_type=NormType.GEMMA_RMS, weight_names="llama",
                activation=_activation(r, act, "gelu_pytorch_tanh", legacy_gelu_is_tanh=True),
                embedding_scale=math.sqrt(base["hidden_size"]), qkv_bias=bias, o_bias=bias)
    return base


def parse_gemma(r: ConfigReader) -> TransformerConfig:
    return _full(r, _gemma_base(r, "gemma"))


def _softcaps(r: ConfigReader) -> dict[str, Any]:
    return dict(attn_softcap=r.float("attn_logit_softcapping", None, gt=0),
                final_softcap=r.float("final_logit_softcapping", None, gt=0),
                query_pre_attn_scalar=r.float("query_pre_attn_scalar", None, gt=0))


def parse_gemma2(r: ConfigReader) -> TransformerConfig:
    base = _gemma_base(r, "gemma2")
    base.update(post_norms=True, weight_names="gemma2", **_softcaps(r))
    types = _layer_types(r, base["num_layers"], lambda i: i % 2 == 0)
    window = r.int("sliding_window", None)
    # Gemma 2's hub configs repeat the window as sliding_window_size (transformers ignores it)
    r.refuse_unless("sliding_window_size", window, "it must repeat sliding_window")
    return _finish(r, base, types, _ropes_by_type(r), window)


def parse_gemma3_text(r: ConfigReader) -> TransformerConfig:
    base = _gemma_base(r, "gemma3_text")
    base.update(post_norms=True, qk_norm=True, weight_names="gemma2", **_softcaps(r))
    pattern_key = "sliding_window_pattern" if r.has("sliding_window_pattern") \
        else "_sliding_window_pattern"
    r.read.update({"sliding_window_pattern", "_sliding_window_pattern"})
    pattern = r.int(pattern_key, 6)
    types = _layer_types(r, base["num_layers"], lambda i: bool((i + 1) % pattern))
    ropes = _ropes_by_type(r, local_theta_key="rope_local_base_freq")
    if not r.has("rope_parameters") and not r.has("rope_theta"):
        ropes["full_attention"] = attrs.evolve(ropes["full_attention"], theta=1_000_000.0)
    return _finish(r, base, types, ropes, r.int("sliding_window", None))


def parse_phi3(r: ConfigReader) -> TransformerConfig:
    rs = r.cfg.get("rope_scaling")
    if isinstance(rs, dict) and "su" in (rs.get("type"), rs.get("rope_type")):
        # Phi-3's first 128k releases (and models fine-tuned from them) say "su" for
        # longrope; transformers' Phi3Config renames it the same way
        r.cfg = {**r.cfg, "rope_scaling": {**{k: v for k, v in rs.items() if k != "type"},
                                           "rope_type": "longrope"}}
    base = _base(r, "phi3")
    base.update(qkv_layout=QkvLayout.FUSED, mlp_layout=MlpLayout.GATED_FUSED,
                weight_names="phi3")
    # only longrope scaling reads it (refused by the rope parser until implemented)
    r.int("original_max_position_embeddings", None)
    # Phi-3's config.json says attention_bias: false; transformers' Phi-3 has no biases
    r.refuse_unless("attention_bias", False, "Phi-3's projections have no biases")
    # Phi-4-mini's config.json says mlp_bias: false; transformers' Phi-3 MLP has no biases
    r.refuse_unless("mlp_bias", False, "Phi-3's MLP has no biases")
    return _all_sliding(r, base)


def parse_starcoder2(r: ConfigReader) -> TransformerConfig:
    base = _base(r, "starcoder2", eps_key="norm_epsilon", eps_default=1e-5,
                 act_default="gelu_pytorch_tanh", tie_default=True)
    bias = r.bool("use_bias", True)
    base.update(norm_type=NormType.LAYER_NORM, norm_bias=True, mlp_layout=MlpLayout.PLAIN,
                qkv_bias=bias, o_bias=bias, mlp_bias=bias, weight_names="starcoder2")
    return _all_sliding(r, base)


# ----------------------------------------------------------------------------------------
# LLaMA-like families with twists: OLMo, OLMo2, Granite, SmolLM3, Gemma 3 multimodal, Cohere
# ----------------------------------------------------------------------------------------

def parse_olmo(r: ConfigReader) -> TransformerConfig:
    """OLMo: LayerNorm without weights or bias (eps fixed at 1e-5), optional clip_qkv."""
    base = _base(r, "olmo")
    bias = r.bool("attention_bias", False)
    base.update(norm_type=NormType.LAYER_NORM, norm_affine=False, norm_eps=1e-5,
                qkv_bias=bias, o_bias=bias, clip_qkv=r.float("clip_qkv", None, gt=0),
                rope_float32=True,  # transformers' float32 cos / sin (as OLMo2)
                norm_gain_float32=True)  # transformers: layer_norm(x.float()).to(x.dtype)
    return _full(r, base)


def parse_olmo2(r: ConfigReader) -> TransformerConfig:
    """OLMo2: RMS norms after attention and MLP only (no pre-norms), q/k RMS norms over the
    full projection width."""
    base = _base(r, "olmo2", eps_default=1e-5)
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_full=True, pre_norms=False,
                post_norms=True, weight_names="olmo2", rope_float32=True,
                norm_gain_float32=True)  # transformers: (w * norm(x.float())).to(x.dtype)
    return _full(r, base)


def parse_granite(r: ConfigReader) -> TransformerConfig:
    """Granite: embedding, residual-branch and attention multipliers and a logits divisor
    (transformers' defaults: 1.0 each, so scores are scaled by 1, not head_dim**-0.5)."""
    base = _base(r, "granite")
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, mlp_bias=r.bool("mlp_bias", False),
                embedding_scale=r.float("embedding_multiplier", 1.0, gt=0),
                residual_scale=r.float("residual_multiplier", 1.0, gt=0),
                attn_multiplier=r.float("attention_multiplier", 1.0, gt=0),
                logit_scale=1.0 / r.float("logits_scaling", 1.0, gt=0))
    return _full(r, base)


def parse_smollm3(r: ConfigReader) -> TransformerConfig:
    """SmolLM3: NoPE layers (``no_rope_layers[i] == 0``, else every
    ``no_rope_layer_interval``-th layer), optional sliding window on the NoPE layers."""
    base = _base(r, "smollm3", tie_default=True)
    n = base["num_layers"]
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, mlp_bias=r.bool("mlp_bias", False))
    interval = r.int("no_rope_layer_interval", 4)
    flags = r.list("no_rope_layers")
    if flags is None:
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) != n or not all(f in (0, 1) and not isinstance(f, float) for f in flags):
        raise r.bad("no_rope_layers", flags, f"{n} entries of 0 (no rotary) or 1 (rotary)")
    base["layer_use_rope"] = tuple(bool(f) for f in flags)
    window = r.int("sliding_window", None) if r.bool("use_sliding_window", False) else None
    r.read.add("sliding_window")  # present but unused when use_sliding_window is false
    types = _layer_types(r, n, lambda i: window is not None and not flags[i])
    ropes = _default_theta(r, _ropes_by_type(r), 2_000_000.0)
    return _finish(r, base, types, ropes, window)


#: transformers' Gemma3TextConfig defaults for the keys hub Gemma 3 multimodal checkpoints
#: leave out of their (short) text_config (e.g. google/gemma-3-4b-it lists only sizes,
#: rope_scaling and sliding_window).
_GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256, "sliding_window": 4096,
}
#: Multimodal keys of a Gemma 3 config that only matter with images (the vision tower and the
#: projector are not run; their tensors are ignored by the "gemma3_mm" weight table).
_GEMMA3_MM_KEYS = {"vision_config", "boi_token_index", "eoi_token_index", "image_token_index",
                   "mm_tokens_per_image", "boi_token_id", "eoi_token_id", "image_token_id"}


def parse_gemma3(r: ConfigReader) -> TransformerConfig:
    """Gemma 3 multimodal checkpoints (``model_type: gemma3``): the language model inside,
    parsed from ``text_config`` exactly as ``gemma3_text``; text-only forward (image tokens
    are ordinary tokens here, the vision tower is not loaded)."""
    tc = r.mapping("text_config")
    if tc is None:
        raise ConfigError(f"{r.src}: gemma3 config lacks 'text_config' (the language model)")
    sub = r.sub("text_config", {**_GEMMA3_TEXT_DEFAULTS, **tc})
    cfg = parse_gemma3_text(sub)
    unknown = policy_violations(sub.cfg, sub.read, _GEMMA_HARMLESS, ROTARY, cfg, sub.src)
    if unknown:
        raise UnknownKeysError(f"{sub.src}: keys that change the numbers and are not "
                               f"implemented (or are unknown): {', '.join(unknown)}", unknown)
    r.read.update(_GEMMA3_MM_KEYS)
    tie = r.bool("tie_word_embeddings", cfg.tie_word_embeddings)
    return attrs.evolve(cfg, model_type="gemma3", weight_names="gemma3_mm",
                        tie_word_embeddings=tie)


def parse_cohere(r: ConfigReader) -> TransformerConfig:
    """Cohere (Command R): parallel attention and MLP reading one shared LayerNorm without
    bias, GPT-J's interleaved rotary, logits multiplied by logit_scale, optional per-head
    LayerNorms of q and k (use_qk_norm, gains [heads, d_head])."""
    base = _base(r, "cohere", eps_key="layer_norm_eps", eps_default=1e-5, tie_default=True)
    bias = r.bool("attention_bias", False)
    qk = r.bool("use_qk_norm", False)
    base.update(norm_type=NormType.LAYER_NORM, block=BlockLayout.PARALLEL_SHARED_NORM,
                rope_layout=RopeLayout.INTERLEAVED, qkv_bias=bias, o_bias=bias, qk_norm=qk,
                qk_norm_heads=qk, logit_scale=r.float("logit_scale", 0.0625, gt=0))
    types = ["full_attention"] * base["num_layers"]
    return _finish(r, base, types, _default_theta(r, _ropes_by_type(r), 500_000.0), None)
