"""Parsers of the hybrids whose layers the first hybrids' schedule does not express: Falcon-H1
(attention and a Mamba-2 mixer side by side in every layer) and LFM2 (a gated short
convolution, mi-ssm's ``short_conv`` mixer, interleaved with attention).

Falcon-H1 (``falcon_h1``): every layer is ``x + (ssm_out * mamba2(ssm_in * h) + attn_out *
attn(attn_in * h))`` with ``h = ln1(x)`` (``TransformerConfig.layer_parallel``), then ``x +
mlp(ln2(x))`` with the gate's output times the gate multiplier and the MLP's output times the
down multiplier; keys times ``key_multiplier``; the embedding times ``embedding_multiplier``,
the logits times ``lm_head_multiplier``. Its Mamba-2 scales in_proj's five parts [z | x | B |
C | dt] by ``ssm_multipliers`` (transformers' mup vector), may set d_inner apart from expand
(``mamba_d_ssm``), gates with or without the grouped RMS norm (``mamba_rms_norm``), the norm
before or after the gate (``mamba_norm_before_gate``), and has out_proj's bias apart
(``projectors_bias``).

LFM2 (``lfm2``): ``layer_types`` ("conv" / "full_attention"; without it ``full_attn_idxs``,
whose default is every layer) schedules the short convolution and attention with per-head q/k
RMS norms, each followed by a SwiGLU MLP whose width transformers adjusts
(``block_auto_adjust_ff_dim``); the final norm is ``embedding_norm``. LFM2-MoE
(``lfm2_moe``): the same layers, a mixture of experts after all but the first
``num_dense_layers`` (sigmoid router, expert bias for the choice only).

:data:`HYBRID2_FAMILIES` is what the registry adds to ``FAMILIES``. Nothing outside this
module knows these families' names.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from mi_core.plugin import ConfigError

from mi_transformer.config.axes import ATTENTION, Activation, MoeConfig, TransformerConfig
from mi_transformer.config.common import _base, _default_theta, _ropes_by_type
from mi_transformer.config.families_hybrid import HYBRID_HARMLESS, mixer_config
from mi_transformer.config.families_ssm import SSM_HARMLESS
from mi_transformer.config.neutral import Derived
from mi_transformer.config.reader import ConfigReader

#: Mixer setting -> Falcon-H1's config key (mi_ssm.settings reads them).
FALCON_H1_MAMBA2_KEYS: dict[str, str] = {
    "d_state": "mamba_d_state", "expand": "mamba_expand", "d_ssm": "mamba_d_ssm",
    "d_conv": "mamba_d_conv", "n_heads": "mamba_n_heads", "head_dim": "mamba_d_head",
    "n_groups": "mamba_n_groups", "conv_bias": "mamba_conv_bias",
    "proj_bias": "mamba_proj_bias", "out_bias": "projectors_bias", "act": "hidden_act",
    "norm_eps": "rms_norm_eps", "dt_limit": "time_step_limit", "rms_norm": "mamba_rms_norm",
    "norm_before_gate": "mamba_norm_before_gate", "proj_scales": "ssm_multipliers"}

#: Mixer setting -> LFM2's config key (mi_ssm.short_conv reads them).
LFM2_CONV_KEYS: dict[str, str] = {"d_conv": "conv_L_cache", "bias": "conv_bias"}


def _absent(r: ConfigReader, defaults: dict[str, Any]) -> None:
    """transformers' class defaults for keys absent from the file (a null is left null: for
    these keys transformers reads null differently, e.g. ``mamba_d_ssm: null`` means expand *
    hidden_size while an absent key means 1024)."""
    missing = {k: v for k, v in defaults.items() if k not in r.cfg}
    if missing:
        r.cfg = {**r.cfg, **missing}


def _whole_head_rotary(r: ConfigReader, base: dict[str, Any], model_type: str) -> None:
    """These families' transformers rotary embedding rotates every dim of a head whatever a
    partial rotary factor says: another factor would be read differently, so it is refused."""
    if base.pop("rotary_dim"):
        raise ConfigError(f"{r.src}: a partial rotary factor is not supported: transformers' "
                          f"{model_type} rotates the whole head")


def _multiplier(r: ConfigReader, key: str) -> float:
    return r.float(key, 1.0)


def parse_falcon_h1(r: ConfigReader) -> TransformerConfig:
    """Falcon-H1: attention beside Mamba-2 in every layer, with its multipliers."""
    _absent(r, {"mamba_d_ssm": 1024, "num_key_value_heads": 8, "mamba_n_heads": 128,
                "mamba_d_state": 256, "mamba_d_head": "auto"})
    base = _base(r, "falcon_h1", eps_default=1e-5)
    _whole_head_rotary(r, base, "falcon_h1")
    n, hidden = base["num_layers"], base["hidden_size"]
    mlp = r.list("mlp_multipliers") or [1.0, 1.0]
    if len(mlp) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                and math.isfinite(v) for v in mlp):
        raise r.bad("mlp_multipliers", mlp, "two finite numbers [gate, down]")
    attn_bias = r.bool("attention_bias", False)
    mc = mixer_config(r, "falcon_h1", "mamba2", FALCON_H1_MAMBA2_KEYS, hidden)
    emb = _multiplier(r, "embedding_multiplier")
    return TransformerConfig(
        **base, weight_names="jamba", qkv_bias=attn_bias, o_bias=attn_bias,
        mlp_bias=r.bool("mlp_bias", False), ropes=(_ropes_by_type(r)["full_attention"],),
        layer_rope=(0,) * n, layer_windows=(None,) * n, layer_mixers=("mamba2",) * n,
        mixers=(mc,), layer_parallel=(True,) * n,
        embedding_scale=None if emb == 1.0 else emb,
        logit_scale=_multiplier(r, "lm_head_multiplier"),
        key_scale=_multiplier(r, "key_multiplier"),
        attn_in_scale=_multiplier(r, "attention_in_multiplier"),
        attn_out_scale=_multiplier(r, "attention_out_multiplier"),
        mixer_in_scale=_multiplier(r, "ssm_in_multiplier"),
        mixer_out_scale=_multiplier(r, "ssm_out_multiplier"),
        mlp_gate_scale=float(mlp[0]), mlp_out_scale=float(mlp[1]))


FALCON_H1_READS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "hidden_act", "rms_norm_eps",
    "tie_word_embeddings", "max_position_embeddings", "attention_bias", "mlp_bias",
    "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
    "mlp_multipliers", "embedding_multiplier", "lm_head_multiplier", "key_multiplier",
    "attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier",
    "ssm_out_multiplier", *FALCON_H1_MAMBA2_KEYS.values()})

#: Keys of Falcon-H1's published configs that transformers' FalconH1 never reads:
#: ``mlp_expansion_factor`` (the MLP's width is ``intermediate_size``, which the weights'
#: shapes check) and the chunk / logits-to-keep settings of its kernels and generation.
FALCON_H1_HARMLESS = frozenset({"mlp_expansion_factor", "num_logits_to_keep"})
#: ... and keys of the original code at the only value transformers implements: an MLP in
#: every layer (``mamba_use_mlp``), attention in every layer (``attn_layer_indices`` null).
FALCON_H1_NEUTRAL: dict[str, Any] = {"mamba_use_mlp": True, "attn_layer_indices": None}


#: LFM2's layer_types spellings -> our layer schedule
_LFM2_TYPES = {"conv": "short_conv", "full_attention": ATTENTION}


def _lfm2_schedule(r: ConfigReader, n: int, indices: bool = True) -> tuple[str, ...]:
    """layer_types, else ``full_attn_idxs`` (transformers' default: every layer attention).
    With both, transformers reads layer_types only (the indices are checked, not used).
    Without `indices` (LFM2-MoE, whose config has no such key) layer_types is required."""
    idx = r.list("full_attn_idxs") if indices else None
    if idx is not None and not all(isinstance(i, int) and not isinstance(i, bool)
                                   and 0 <= i < n for i in idx):
        raise r.bad("full_attn_idxs", idx, f"a list of layer indices in 0..{n - 1}")
    types = r.list("layer_types")
    if types is None and not indices:
        raise ConfigError(f"{r.src}: layer_types is required (transformers' Lfm2MoeConfig has "
                          f"no other schedule)")
    if types is None:
        attn = set(range(n)) if idx is None else set(idx)
        types = ["full_attention" if i in attn else "conv" for i in range(n)]
    if len(types) != n or any(t not in _LFM2_TYPES for t in types):
        raise r.bad("layer_types", types, f"{n} entries of {sorted(_LFM2_TYPES)}")
    return tuple(_LFM2_TYPES[t] for t in types)


def _lfm2_mlp_width(r: ConfigReader) -> int:
    """transformers' Lfm2MLP width: ``block_ff_dim`` (else intermediate_size), then with
    ``block_auto_adjust_ff_dim`` 2/3 of it, times ``block_ffn_dim_multiplier`` and rounded up
    to ``block_multiple_of``, in its arithmetic. (Its Lfm2MLP skips the last two for a null
    multiplier, which transformers 5's strict config refuses: null here is the default, 1.)"""
    width = r.int("block_ff_dim", None)
    inter = r.int("intermediate_size")
    width = inter if width is None else width
    multiple = r.int("block_multiple_of", 256)
    factor = r.float("block_ffn_dim_multiplier", 1.0, gt=0)
    if r.bool("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        width = int(factor * width)
        width = multiple * ((width + multiple - 1) // multiple)
    if width < 1:
        raise ConfigError(f"{r.src}: the adjusted MLP width is {width}; it must be >= 1")
    return width


def parse_lfm2(r: ConfigReader) -> TransformerConfig:
    """LFM2: ``x + mixer(ln1(x))`` (the short convolution, or attention with per-head q/k
    norms and RoPE), then ``x + mlp(ln2(x))`` (SwiGLU)."""
    _absent(r, {"vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8})
    width = _lfm2_mlp_width(r)
    base = _lfm2_base(r, "lfm2")
    base["intermediate_size"] = width
    n = base["num_layers"]
    return TransformerConfig(**base, **_lfm2_layers(r, "lfm2", base, _lfm2_schedule(r, n)))


def _lfm2_base(r: ConfigReader, model_type: str) -> dict[str, Any]:
    """The scalars of LFM2 and LFM2-MoE: ``norm_eps``, ``tie_embedding`` (transformers'
    config lets it win over tie_word_embeddings), SiLU only, the whole head rotated."""
    tie = r.bool("tie_embedding", None)
    tied = r.bool("tie_word_embeddings", True) if tie is None else tie
    base = _base(r, model_type, eps_key="norm_eps", eps_default=1e-5)
    if base["activation"] is not Activation.SILU:
        raise ConfigError(f"{r.src}: hidden_act = {r.get('hidden_act')!r} is not supported: "
                          f"transformers' {model_type} MLP always applies SiLU")
    base["tie_word_embeddings"] = tied
    _whole_head_rotary(r, base, model_type)
    return base


def _lfm2_layers(r: ConfigReader, model_type: str, base: dict[str, Any],
                 schedule: tuple[str, ...]) -> dict[str, Any]:
    """The schedule, the short convolution, attention with q/k norms and RoPE (base 1e6)."""
    n = base["num_layers"]
    mc = mixer_config(r, model_type, "short_conv", LFM2_CONV_KEYS, base["hidden_size"])
    ropes = _default_theta(r, _ropes_by_type(r), 1000000.0)
    return dict(weight_names="lfm2", qk_norm=True, ropes=(ropes["full_attention"],),
                layer_rope=(0,) * n, layer_windows=(None,) * n, layer_mixers=schedule,
                mixers=(mc,))


def parse_lfm2_moe(r: ConfigReader) -> TransformerConfig:
    """LFM2-MoE: LFM2's layers, the first ``num_dense_layers`` with a SwiGLU MLP of
    intermediate_size (not adjusted), the rest a mixture of experts: sigmoid scores, top-k of
    scores + ``expert_bias`` (``use_expert_bias``), the chosen scores renormalised by their
    sum + 1e-6 and scaled by ``routed_scaling_factor``."""
    _absent(r, {"vocab_size": 65536, "hidden_size": 2048, "intermediate_size": 7168,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8})
    base = _lfm2_base(r, "lfm2_moe")
    n = base["num_layers"]
    dense = r.int("num_dense_layers", 2, min=0)
    moe = MoeConfig(num_experts=r.int("num_experts", 32), top_k=r.int("num_experts_per_tok", 4),
                    expert_size=r.int("moe_intermediate_size", 1792),
                    norm_topk_prob=r.bool("norm_topk_prob", True), block="feed_forward",
                    expert_names=("w1", "w3", "w2"), router_name="gate", scoring="sigmoid",
                    selection_bias="expert_bias" if r.bool("use_expert_bias", True) else "",
                    routed_scaling=r.float("routed_scaling_factor", 1.0, gt=0),
                    sigmoid_norm_eps=1e-6)
    return TransformerConfig(
        **base, **_lfm2_layers(r, "lfm2_moe", base, _lfm2_schedule(r, n, indices=False)),
        moe=moe, layer_moe=tuple(i >= dense for i in range(n)))


LFM2_READS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "hidden_act", "norm_eps",
    "tie_word_embeddings", "tie_embedding", "max_position_embeddings", "rope_theta",
    "rope_scaling", "rope_parameters", "partial_rotary_factor", "block_ff_dim",
    "block_multiple_of", "block_ffn_dim_multiplier", "block_auto_adjust_ff_dim",
    "full_attn_idxs", "layer_types", *LFM2_CONV_KEYS.values()})

#: Initialisation settings of LFM2's published configs (transformers never reads them).
LFM2_HARMLESS = frozenset({"block_mlp_init_scale", "block_out_init_scale",
                           "block_use_xavier_init", "conv_use_xavier_init"})

LFM2_MOE_READS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "hidden_act", "norm_eps",
    "tie_word_embeddings", "tie_embedding", "max_position_embeddings", "rope_theta",
    "rope_scaling", "rope_parameters", "partial_rotary_factor", "layer_types",
    "num_dense_layers", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "norm_topk_prob", "use_expert_bias", "routed_scaling_factor", *LFM2_CONV_KEYS.values()})
#: ... LFM2-MoE's: its dense MLP takes intermediate_size as it is (transformers' Lfm2MoeMLP
#: reads no block_* width key; the weights' shapes check the width), and its training keys.
LFM2_MOE_HARMLESS = LFM2_HARMLESS | {
    "block_ff_dim", "block_multiple_of", "block_ffn_dim_multiplier", "block_auto_adjust_ff_dim",
    "output_router_logits", "router_aux_loss_coef"}
_HIDDEN = Derived("hidden_size", lambda c: c.hidden_size)
#: Keys of LFM2's original code that transformers' Lfm2 does not read, at the only value it
#: implements: widths equal to hidden_size, the heads, norm eps and rotary base it reads
#: under their own keys, SwiGLU, rotary positions.
LFM2_NEUTRAL: dict[str, Any] = {
    "block_dim": _HIDDEN, "conv_dim": _HIDDEN, "conv_dim_out": _HIDDEN,
    "num_heads": Derived("num_attention_heads", lambda c: c.num_heads),
    "block_norm_eps": Derived("norm_eps", lambda c: c.norm_eps),
    "theta": Derived("the rotary base (rope_theta)", lambda c: c.ropes[0].theta),
    "block_use_swiglu": True, "use_pos_enc": True}


#: (model_type, parser, keys read, keys harmless, note, neutral): the registry's entries.
HYBRID2_FAMILIES: list[tuple[str, Callable[[ConfigReader], TransformerConfig], frozenset[str],
                             frozenset[str], str, dict[str, Any]]] = [
    ("falcon_h1", parse_falcon_h1, FALCON_H1_READS,
     HYBRID_HARMLESS | SSM_HARMLESS | FALCON_H1_HARMLESS,
     "attention beside Mamba-2 (mi-ssm) in every layer, with Falcon-H1's multipliers",
     FALCON_H1_NEUTRAL),
    ("lfm2", parse_lfm2, LFM2_READS, LFM2_HARMLESS,
     "gated short convolution (mi-ssm) + attention with q/k norms, SwiGLU", LFM2_NEUTRAL),
    ("lfm2_moe", parse_lfm2_moe, LFM2_MOE_READS, LFM2_MOE_HARMLESS,
     "LFM2's layers, MoE after the first dense ones (sigmoid router with an expert bias)",
     LFM2_NEUTRAL),
]
