"""Parsers of the hybrid families: layers of a plugin's state-space mixer (mi-ssm) interleaved
with attention layers, each layer followed by an MLP (or a mixture of experts).

A hybrid is a schedule in :class:`TransformerConfig` (``layer_mixers``: the mixer's name or
``ATTENTION`` per layer) run by the one generic block (:mod:`mi_transformer.mixers` for the
mixer layers, the attention block for the others); a family is its parser here, the mixer's
key table and a weight-name table (``mi_transformer.weights.NAME_TABLES``). Nothing outside
this module knows a hybrid family's name.

Jamba (``jamba``): Mamba-1 mixers with gained RMS norms of dt, B and C, attention without
positions every ``attn_layer_period`` layers, a mixture of experts (softmax router, top-k
weights not renormalised) every ``expert_layer_period`` layers, a gated MLP elsewhere.

Bamba (``bamba``): Mamba-2 mixers, attention with partial rotary (half the head: transformers
hard-codes ``partial_rotary_factor`` 0.5) on the layers ``attn_layer_indices`` lists, a gated
MLP after every layer.

GraniteMoeHybrid (``granitemoehybrid``, Granite 4.0-H): Bamba's mixers and Granite's
multipliers (embedding, residual branches, attention scale, logits divisor), attention with
full RoPE or none (``position_embedding_type``), after each layer a mixture of experts (top-k
of the router logits, softmax over them) plus an always-on shared MLP, or the shared MLP
alone (``num_local_experts`` 0).

Nemotron-H (``nemotron_h``): every layer is ``x + f(norm(x))`` with f one of Mamba-2,
attention without positions, a squared-ReLU MLP (``MLP_ONLY``), or (Nemotron 3's "moe" / "E"
layers: ``MLP_ONLY`` with ``layer_moe``) a mixture of plain squared-ReLU experts, DeepSeek-V3's
router (sigmoid scores, a selection bias, group-limited top-k, routed scaling), an optional
latent projection around the routed experts and an always-on shared expert.
"""

from __future__ import annotations

from typing import Any, Mapping

from mi_core.plugin import ConfigError, UnsupportedModelError, mixer

from mi_transformer.config.axes import ATTENTION, MLP_ONLY, MixerConfig, MlpLayout, MoeConfig, \
    Positions, TransformerConfig
from mi_transformer.config.common import _activation, _base, _heads, _ropes_by_type
from mi_transformer.config.neutral import Derived
from mi_transformer.config.reader import ConfigReader

#: Mixer setting -> Jamba's config key (mi_ssm.settings reads them).
JAMBA_MAMBA_KEYS: dict[str, str] = {
    "d_state": "mamba_d_state", "expand": "mamba_expand", "d_conv": "mamba_d_conv",
    "dt_rank": "mamba_dt_rank", "conv_bias": "mamba_conv_bias", "proj_bias": "mamba_proj_bias",
    "act": "hidden_act", "bcdt_norm": "rms_norm_eps"}

#: Mixer setting -> Bamba's (and Granite 4's) config key.
BAMBA_MAMBA2_KEYS: dict[str, str] = {
    "d_state": "mamba_d_state", "expand": "mamba_expand", "d_conv": "mamba_d_conv",
    "n_heads": "mamba_n_heads", "head_dim": "mamba_d_head", "n_groups": "mamba_n_groups",
    "conv_bias": "mamba_conv_bias", "proj_bias": "mamba_proj_bias", "act": "hidden_act",
    "norm_eps": "rms_norm_eps", "dt_limit": "time_step_limit"}

#: Keys of the hybrid configs that only initialise, train or pick a kernel.
HYBRID_HARMLESS = frozenset({
    "use_mamba_kernels", "use_mambapy", "use_associative_scan", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", "max_position_embeddings",
    "mamba_chunk_size", "num_logits_to_keep", "z_loss_coefficient"})


def mixer_config(r: ConfigReader, model_type: str, name: str, keys: Mapping[str, str],
                 hidden: int) -> MixerConfig:
    """The plugin mixer `name` with the settings it reads through the family's key table (a
    typed refusal saying what to install when no plugin provides it)."""
    try:
        spec = mixer(name, f"{r.src}: model_type {model_type!r}")
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{exc}; the state-space mixers come with mi-ssm (pip "
                                    f"install 'mi-core[ssm]')") from None
    return MixerConfig(name, spec, spec.settings(r, keys, hidden))


def _periodic(r: ConfigReader, n: int, period_key: str, offset_key: str,
              defaults: tuple[int, int]) -> tuple[bool, ...]:
    """Layer i is marked where i % period == offset (transformers' Jamba schedule)."""
    period = r.int(period_key, defaults[0])
    offset = r.int(offset_key, defaults[1], min=0)
    if period < 1 or not 0 <= offset < period:
        raise ConfigError(f"{r.src}: {offset_key} = {offset} must be in 0..{period_key} - 1 "
                          f"(= {period - 1})")
    return tuple(i % period == offset for i in range(n))


def parse_jamba(r: ConfigReader) -> TransformerConfig:
    """Jamba: ``x + mixer(ln1(x))`` (Mamba-1 or attention without positions), then ``x +
    ffn(ln2(x))`` (MoE where ``i % expert_layer_period == expert_layer_offset`` and there is
    more than one expert, else a gated MLP)."""
    hidden, n = r.int("hidden_size"), r.int("num_hidden_layers")
    heads, kv, head_dim = _heads(r, hidden, "num_attention_heads", "num_key_value_heads")
    attn = _periodic(r, n, "attn_layer_period", "attn_layer_offset", (8, 4))
    experts = r.int("num_experts", None)
    local = r.int("num_local_experts", None)  # transformers' attribute_map spelling
    if experts is not None and local is not None and experts != local:
        raise ConfigError(f"{r.src}: num_experts = {experts} and num_local_experts = {local} "
                          f"disagree")
    experts = experts or local or 16
    sparse = _periodic(r, n, "expert_layer_period", "expert_layer_offset", (2, 1))
    inter = r.int("intermediate_size")
    moe = None
    if experts > 1 and any(sparse):
        moe = MoeConfig(num_experts=experts, top_k=r.int("num_experts_per_tok", 2),
                        expert_size=inter, norm_topk_prob=False, block="feed_forward",
                        router_name="router")
    mc = mixer_config(r, "jamba", "mamba", JAMBA_MAMBA_KEYS, hidden)
    return TransformerConfig(
        model_type="jamba", vocab_size=r.int("vocab_size"), hidden_size=hidden, num_layers=n,
        num_heads=heads, num_kv_heads=kv, head_dim=head_dim, intermediate_size=inter,
        weight_names="jamba", norm_eps=r.float("rms_norm_eps", 1e-6, gt=0),
        activation=_activation(r, "hidden_act", "silu"),
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        positions=Positions.NONE, layer_rope=(0,) * n, layer_windows=(None,) * n,
        layer_mixers=tuple(ATTENTION if a else "mamba" for a in attn), mixers=(mc,),
        moe=moe, layer_moe=tuple(s and moe is not None for s in sparse))


JAMBA_READS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "hidden_act", "rms_norm_eps",
    "tie_word_embeddings", "attn_layer_period", "attn_layer_offset", "expert_layer_period",
    "expert_layer_offset", "num_experts", "num_local_experts", "num_experts_per_tok",
    *JAMBA_MAMBA_KEYS.values()})


def _attention_layers(r: ConfigReader, key: str, n: int) -> tuple[bool, ...]:
    """Layer i is an attention layer where the list `key` names it (indices in range)."""
    idx = r.list(key) or []
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in idx):
        raise r.bad(key, idx, f"a list of layer indices in 0..{n - 1}")
    return tuple(i in idx for i in range(n))


def _rotary_half(r: ConfigReader, base: dict[str, Any]) -> None:
    """Bamba's rotary dims: transformers overrides any ``partial_rotary_factor`` with 0.5, so
    a config saying otherwise would be read differently by it: refused."""
    params = r.mapping("rope_parameters") or {}
    for where, value in (("partial_rotary_factor", r.get("partial_rotary_factor")),
                         ("rope_parameters.partial_rotary_factor",
                          params.get("partial_rotary_factor"))):
        if value is not None and value != 0.5:
            raise ConfigError(f"{r.src}: {where} = {value!r}: transformers always uses 0.5 "
                              f"for this family")
    base["rotary_dim"] = base["head_dim"] // 2


def parse_bamba(r: ConfigReader) -> TransformerConfig:
    """Bamba: ``x + mixer(ln1(x))`` (Mamba-2, or attention with half-rotary RoPE), then ``x +
    mlp(ln2(x))``."""
    base = _base(r, "bamba", eps_default=1e-5)
    n, hidden = base["num_layers"], base["hidden_size"]
    _rotary_half(r, base)
    bias = r.bool("attention_bias", False)
    attn = _attention_layers(r, "attn_layer_indices", n)
    mc = mixer_config(r, "bamba", "mamba2", BAMBA_MAMBA2_KEYS, hidden)
    ropes = _ropes_by_type(r)
    return TransformerConfig(
        **base, weight_names="jamba", qkv_bias=bias, o_bias=bias,
        mlp_bias=r.bool("mlp_bias", False), ropes=(ropes["full_attention"],),
        layer_rope=(0,) * n, layer_windows=(None,) * n,
        layer_mixers=tuple(ATTENTION if a else "mamba2" for a in attn), mixers=(mc,))


BAMBA_READS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "hidden_act", "rms_norm_eps",
    "tie_word_embeddings", "max_position_embeddings", "attention_bias", "mlp_bias",
    "attn_layer_indices", "rope_theta", "rope_scaling", "rope_parameters",
    "partial_rotary_factor", *BAMBA_MAMBA2_KEYS.values()})


#: layer_types spellings: the hub's Granite 4 configs ("mamba" / "attention") and
#: transformers 5's ("linear_attention" / "full_attention")
_GRANITE_TYPES = {"mamba": False, "linear_attention": False, "attention": True,
                  "full_attention": True}


def parse_granitemoehybrid(r: ConfigReader) -> TransformerConfig:
    """Granite 4.0-H: ``x + s * mixer(ln1(x))`` (Mamba-2 or attention), then ``x + s *
    (moe(h) + shared_mlp(h))`` with h = ln2(x) and s = residual_multiplier."""
    base = _base(r, "granitemoehybrid")
    n, hidden = base["num_layers"], base["hidden_size"]
    types = r.list("layer_types") or ["mamba"] * n
    if len(types) != n or any(t not in _GRANITE_TYPES for t in types):
        raise r.bad("layer_types", types, f"{n} entries of {sorted(_GRANITE_TYPES)}")
    pos = r.str("position_embedding_type", "nope", choices=("rope", "nope"))
    bias = r.bool("attention_bias", False)
    shared = r.int("shared_intermediate_size", 1024)
    experts = r.int("num_local_experts", 8, min=0)
    # read (unused) without experts too: the dense Granite 4.0 configs publish 0 beside
    # num_local_experts 0 (transformers builds no router then)
    top_k = r.int("num_experts_per_tok", 2, min=1 if experts else 0)
    moe = None
    if experts:
        moe = MoeConfig(num_experts=experts, top_k=top_k,
                        expert_size=base["intermediate_size"], norm_topk_prob=True,
                        shared_expert_size=shared, block="block_sparse_moe",
                        router_name="router.layer", expert_names=("input_linear", "", "output_linear"),
                        fused_experts=True, shared_module="shared_mlp")
    else:  # the shared MLP alone: a fused gated MLP of shared_intermediate_size
        base["intermediate_size"] = shared
    mc = mixer_config(r, "granitemoehybrid", "mamba2", BAMBA_MAMBA2_KEYS, hidden)
    return TransformerConfig(
        **base, weight_names="granitemoehybrid", qkv_bias=bias, o_bias=bias,
        mlp_layout=MlpLayout.GATED_FUSED, moe=moe, layer_moe=(moe is not None,) * n,
        positions=Positions.ROPE if pos == "rope" else Positions.NONE,
        ropes=(_ropes_by_type(r)["full_attention"],), layer_rope=(0,) * n,
        layer_windows=(None,) * n,
        layer_mixers=tuple(ATTENTION if _GRANITE_TYPES[t] else "mamba2" for t in types),
        mixers=(mc,), embedding_scale=r.float("embedding_multiplier", 1.0, gt=0),
        residual_scale=r.float("residual_multiplier", 1.0, gt=0),
        attn_multiplier=r.float("attention_multiplier", 1.0, gt=0),
        logit_scale=1.0 / r.float("logits_scaling", 1.0, gt=0))


#: Granite 4.0-H configs' training-time keys: the initialisation scheme only.
GRANITEMOEHYBRID_HARMLESS = frozenset({"init_method"})
#: ... and a key that names what transformers always does (RMS norms).
GRANITEMOEHYBRID_NEUTRAL = {"normalization_function": "rmsnorm"}

GRANITEMOEHYBRID_READS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "hidden_act", "rms_norm_eps",
    "tie_word_embeddings", "max_position_embeddings", "attention_bias", "layer_types",
    "position_embedding_type", "shared_intermediate_size", "num_local_experts",
    "num_experts_per_tok", "embedding_multiplier", "residual_multiplier",
    "attention_multiplier", "logits_scaling", "rope_theta", "rope_scaling", "rope_parameters",
    "partial_rotary_factor", *BAMBA_MAMBA2_KEYS.values()})


#: Nemotron-H's layer kinds: transformers 5's names, hybrid_override_pattern's letters and
#: the "mamba" / "attention" that Nemotron 3 Ultra's layers_block_type says (transformers
#: remaps them: configuration_utils._LEGACY_LAYER_TYPE_REMAP)
_NEMOTRON_TYPES = {"linear_attention": "mamba2", "full_attention": ATTENTION, "mlp": MLP_ONLY,
                   "moe": "moe", "M": "mamba2", "*": ATTENTION, "-": MLP_ONLY, "E": "moe",
                   "mamba": "mamba2", "attention": ATTENTION}
#: legacy spelling -> the key transformers 5 reads (its config moves them on load)
_NEMOTRON_LEGACY = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel",
                    "mamba_expand": "expand", "mamba_dt_min": "time_step_min",
                    "mamba_dt_max": "time_step_max", "mamba_dt_limit": "time_step_limit",
                    "mamba_conv_bias": "use_conv_bias", "mamba_chunk_size": "chunk_size"}


def _nemotron_schedule(r: ConfigReader) -> list[str]:
    kinds = r.list("layers_block_type")
    pattern = r.str("hybrid_override_pattern", None)
    if kinds is None and pattern is None:
        raise ConfigError(f"{r.src}: neither layers_block_type nor hybrid_override_pattern "
                          f"says which layer is which")
    given = list(kinds) if kinds is not None else list(pattern or "")
    if pattern is not None and kinds is not None and \
            [_NEMOTRON_TYPES.get(c) for c in pattern] != [_NEMOTRON_TYPES.get(k) for k in kinds]:
        raise ConfigError(f"{r.src}: hybrid_override_pattern {pattern!r} disagrees with "
                          f"layers_block_type")
    bad = sorted({repr(k) for k in given if k not in _NEMOTRON_TYPES})
    if bad:
        raise ConfigError(f"{r.src}: layer kinds {bad} not supported; supported: Mamba-2, "
                          f"attention, MLP, mixture of experts")
    return [_NEMOTRON_TYPES[k] for k in given]


def _nemotron_moe(r: ConfigReader) -> MoeConfig:
    """Nemotron 3's mixture of experts (transformers' NemotronHMoE): plain relu2 experts
    (``experts.{e}.up_proj`` / ``down_proj``), DeepSeek-V3's router (``gate``: float32
    sigmoid scores, ``e_score_correction_bias`` for the choice only, the best topk_group of
    n_group groups by their two best scores, renormalised + 1e-20, times
    routed_scaling_factor), the routed experts inside fc1 / fc2_latent_proj where
    moe_latent_size is set, and one shared expert (``shared_experts``) beside them."""
    experts = r.int("n_routed_experts", 8, min=1)
    local = r.int("num_local_experts", None)  # transformers' attribute_map spelling
    if local is not None and local != experts:
        raise ConfigError(f"{r.src}: n_routed_experts = {experts} and num_local_experts = "
                          f"{local} disagree")
    # transformers' NemotronHMLP gives the shared expert biases with mlp_bias (the stacked
    # experts have none): not implemented for the MoE layers
    r.refuse_unless("mlp_bias", False, "with mixture-of-experts layers (the shared expert's "
                    "and latent projections' biases) it is not supported")
    return MoeConfig(
        num_experts=experts, top_k=r.int("num_experts_per_tok", 2),
        expert_size=r.int("moe_intermediate_size", 7688, min=1),
        norm_topk_prob=r.bool("norm_topk_prob", True),
        shared_expert_size=r.int("moe_shared_expert_intermediate_size", 7688, min=1),
        block="mixer", shared_name="shared_experts", scoring="sigmoid",
        selection_bias="gate.e_score_correction_bias", n_group=r.int("n_group", 1, min=1),
        topk_group=r.int("topk_group", 1, min=1),
        routed_scaling=r.float("routed_scaling_factor", 1.0), gated=False,
        latent_size=r.int("moe_latent_size", None, min=1) or 0, accumulate_float32=True)


def parse_nemotron_h(r: ConfigReader) -> TransformerConfig:
    """Nemotron-H: one of Mamba-2 / attention (no positions) / relu2 MLP per layer."""
    kinds = _nemotron_schedule(r)
    n, hidden = len(kinds), r.int("hidden_size")
    if r.has("num_hidden_layers") and r.int("num_hidden_layers") != n:
        raise ConfigError(f"{r.src}: num_hidden_layers = {r.get('num_hidden_layers')} but the "
                          f"schedule has {n} layers")
    heads = r.int("num_attention_heads")
    kv = r.int("num_key_value_heads", heads)
    if heads % kv:
        raise ConfigError(f"{r.src}: num_attention_heads = {heads} is not a multiple of "
                          f"num_key_value_heads = {kv}")
    # transformers' NemotronHConfig defaults head_dim to 128, not hidden / heads (published
    # configs before transformers 5 say attention_head_dim instead, which it never reads)
    head_dim = r.int("head_dim", 128, min=1)
    key = {new: old for old, new in _NEMOTRON_LEGACY.items() if r.has(old)}
    keys = {"d_state": "ssm_state_size", "d_conv": key.get("conv_kernel", "conv_kernel"),
            "n_heads": "mamba_num_heads", "head_dim": "mamba_head_dim",
            "n_groups": key.get("n_groups", "n_groups"), "conv_bias": key.get(
                "use_conv_bias", "use_conv_bias"), "proj_bias": "use_bias",
            "act": "mamba_hidden_act", "norm_eps": "layer_norm_epsilon",
            "dt_min": key.get("time_step_min", "time_step_min")}
    mc = mixer_config(r, "nemotron_h", "mamba2", keys, hidden)
    r.refuse_unless("residual_in_fp32", False, "transformers' Nemotron-H never reads it: "
                    "the residual stream is in the model's dtype")
    sparse = tuple(k == "moe" for k in kinds)
    moe = _nemotron_moe(r) if any(sparse) else None
    kinds = [MLP_ONLY if k == "moe" else k for k in kinds]
    return TransformerConfig(
        model_type="nemotron_h", vocab_size=r.int("vocab_size"), hidden_size=hidden,
        num_layers=n, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        intermediate_size=r.int("intermediate_size"), weight_names="nemotron_h",
        norm_eps=r.float("layer_norm_epsilon", 1e-5, gt=0),
        norm_gain_float32=True,  # transformers: (w.float() * norm(x.float())).to(x.dtype)
        activation=_activation(r, "mlp_hidden_act", "relu2"), mlp_layout=MlpLayout.PLAIN,
        mlp_bias=r.bool("mlp_bias", False),
        tie_word_embeddings=r.bool("tie_word_embeddings", False), positions=Positions.NONE,
        layer_rope=(0,) * n, layer_windows=(None,) * n, layer_mixers=tuple(kinds),
        mixers=(mc,), layer_mlp=tuple(k == MLP_ONLY for k in kinds), moe=moe,
        layer_moe=sparse if moe is not None else ())


NEMOTRON_H_READS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "mlp_hidden_act", "mlp_bias",
    "layer_norm_epsilon", "tie_word_embeddings", "layers_block_type",
    "hybrid_override_pattern", "ssm_state_size", "mamba_num_heads", "mamba_head_dim",
    "mamba_hidden_act", "use_bias", "residual_in_fp32", "conv_kernel", "n_groups",
    "use_conv_bias", "time_step_min", *_NEMOTRON_LEGACY, "n_routed_experts",
    "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
    "moe_shared_expert_intermediate_size", "n_group", "topk_group", "routed_scaling_factor",
    "moe_latent_size"})

#: Nemotron-H keys transformers does not read for the numbers (the mixer's dt is clamped at
#: time_step_min, not time_step_limit; expand is implied by heads x head_dim; its attention
#: has no biases whatever attention_bias says; the MoE has one shared expert whatever
#: n_shared_experts says and ignores moe_shared_expert_overlap), the MoE sizes read only
#: where the schedule has MoE layers, and the multi-token-prediction layers (mtp.*), which
#: transformers neither builds nor loads: they are not part of the causal-LM forward.
NEMOTRON_H_HARMLESS = frozenset({
    # auto_map: the remote code these checkpoints shipped with before transformers had the
    # family; transformers 5 runs its own implementation (which we match) unless told to
    # trust remote code
    "auto_map", "attention_bias", "time_step_limit", "expand", "time_step_max",
    "time_step_floor", "mamba_proj_bias",
    "mamba_ssm_cache_dtype", "num_logits_to_keep", "sliding_window", "n_routed_experts",
    "n_shared_experts", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
    "moe_latent_size", "moe_shared_expert_overlap", "num_experts_per_tok",
    "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob", "num_local_experts",
    "num_nextn_predict_layers", "mtp_layers_block_type", "mtp_hybrid_override_pattern",
    # published next to layer_norm_epsilon (which the norms use) and to Mamba-2's
    # time-step keys; transformers' Nemotron-H reads neither
    "rms_norm_eps", "time_step_rank",
    # Nemotron 3 Nano publishes these too: its attention has no positions (transformers'
    # Nemotron-H builds no rotary embedding and reads neither), its norms read
    # layer_norm_epsilon
    "norm_eps", "rope_theta", "partial_rotary_factor"})
#: The published configs' attention_head_dim (the remote code's name): transformers reads
#: head_dim (default 128), so it is neutral where it equals the head width used.
NEMOTRON_H_NEUTRAL = {"attention_head_dim": Derived("the attention head width",
                                                    lambda c: c.head_dim)}
