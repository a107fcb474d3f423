"""Parser of Zamba2 (``zamba2``): Mamba-2 layers, some of which first run a shared attention
block (the ``shared_block`` axis, :mod:`mi_transformer.shared_block`).

transformers' layer kinds (``layers_block_type``, or ``layer_types``): "linear_attention"
(legacy "mamba") is ``x + mamba2(norm(x))``; "hybrid" is ``x + mamba2(norm(x + t))`` with
``t = linear_i(mlp(ln(attn(ln([x | e])))))``, e the token embeddings, the attention and MLP
those of weight set ``j % num_mem_blocks`` for the j-th hybrid layer (transformers ties them),
with use j's LoRA adapters (q / k / v where ``use_shared_attention_adapter``; the MLP's
gate | up always) and its own ``linear``. The attention reads ``2 * hidden_size`` with
``head_dim = 2 * hidden_size / num_attention_heads`` and scales scores by ``(head_dim /
2)^-0.5``; RoPE only with ``use_mem_rope``. The Mamba-2 mixers: conv bias always (whatever
``use_conv_bias`` says, as transformers), projection biases ``add_bias_linear``, dt clamped
below at ``time_step_min``, the gated norm's eps fixed at 1e-5. A family is this parser, the
mixer's key table and the weight-name table ``zamba2``.
"""

from __future__ import annotations

from mi_core.plugin import ConfigError

from mi_transformer.config.axes import MlpLayout, Positions, SharedBlockConfig, \
    TransformerConfig
from mi_transformer.config.common import _activation, _ropes_by_type
from mi_transformer.config.families_hybrid import mixer_config
from mi_transformer.config.neutral import Derived
from mi_transformer.config.reader import ConfigReader

#: Mixer setting -> Zamba2's config key (mi_ssm.settings reads them).
ZAMBA2_MAMBA2_KEYS: dict[str, str] = {
    "d_state": "mamba_d_state", "d_conv": "mamba_d_conv", "expand": "mamba_expand",
    "n_heads": "n_mamba_heads", "head_dim": "mamba_headdim", "n_groups": "mamba_ngroups",
    "proj_bias": "add_bias_linear", "dt_min": "time_step_min"}
#: layer kinds: transformers 5's spelling, the hub's legacy "mamba", and "hybrid"
_KINDS = {"linear_attention": False, "mamba": False, "hybrid": True}


def _default_kinds() -> list[str]:
    """transformers' Zamba2Config default schedule (Zamba2-2.7B's 54 layers)."""
    return (["linear_attention"] + (["linear_attention"] * 5 + ["hybrid"]) * 7
            + ["linear_attention"] * 4 + ["hybrid"] + ["linear_attention"] * 3 + ["hybrid"]
            + ["linear_attention"] * 2)


def _kinds(r: ConfigReader, n: int) -> list[bool]:
    kinds = r.list("layers_block_type")
    other = r.list("layer_types")  # transformers' attribute_map spelling of the same list
    if kinds is not None and other is not None and kinds != other:
        raise ConfigError(f"{r.src}: layers_block_type and layer_types disagree")
    kinds = kinds if kinds is not None else other if other is not None else _default_kinds()
    if len(kinds) != n or any(k not in _KINDS for k in kinds):
        raise r.bad("layers_block_type", kinds,
                    f"{n} entries (num_hidden_layers) of {sorted(_KINDS)}")
    return [_KINDS[k] for k in kinds]


def parse_zamba2(r: ConfigReader) -> TransformerConfig:
    """Zamba2: every layer Mamba-2; the "hybrid" ones run the shared block first."""
    hidden, n = r.int("hidden_size"), r.int("num_hidden_layers")
    heads = r.int("num_attention_heads")
    kv = r.int("num_key_value_heads", heads)
    if heads % kv or (2 * hidden) % heads:
        raise ConfigError(f"{r.src}: num_attention_heads {heads} must divide 2 * hidden_size "
                          f"= {2 * hidden} and be a multiple of num_key_value_heads {kv}")
    head_dim = 2 * hidden // heads
    hybrid = _kinds(r, n)
    uses = sum(hybrid)
    attn_adapters = r.bool("use_shared_attention_adapter", False)
    if attn_adapters and kv != heads:  # transformers' adapters are 2 * hidden wide for k, v
        raise ConfigError(f"{r.src}: use_shared_attention_adapter with num_key_value_heads "
                          f"{kv} != num_attention_heads {heads}: transformers cannot run it")
    bias = r.bool("add_bias_linear", False)
    shared = SharedBlockConfig(num_blocks=r.int("num_mem_blocks", 1), uses=uses,
                               adapter_rank=r.int("adapter_rank", 128),
                               attn_adapters=attn_adapters, mlp_bias=bias)
    rope = r.bool("use_mem_rope", False)
    long = r.bool("use_long_context", False)  # transformers: 16384 positions, nothing else
    max_pos = 16384 if long else r.int("max_position_embeddings", 4096)
    d_inner = r.int("mamba_expand", 2) * hidden
    heads_m = r.int("n_mamba_heads", 8)
    # transformers derives mamba_headdim (a value written in the file must agree)
    r.fallback = {**r.fallback, "mamba_headdim": d_inner // heads_m}
    mc = mixer_config(r, "zamba2", "mamba2", ZAMBA2_MAMBA2_KEYS, hidden)
    j = iter(range(uses))
    return TransformerConfig(
        model_type="zamba2", vocab_size=r.int("vocab_size"), hidden_size=hidden, num_layers=n,
        num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        intermediate_size=r.int("intermediate_size", None) or 4 * hidden,
        weight_names="zamba2", norm_eps=r.float("rms_norm_eps", 1e-5, gt=0),
        activation=_activation(r, "hidden_act", "gelu"), mlp_layout=MlpLayout.GATED_FUSED,
        mlp_bias=bias, tie_word_embeddings=r.bool("tie_word_embeddings", True),
        positions=Positions.ROPE if rope else Positions.NONE,
        ropes=(_ropes_by_type(r)["full_attention"],), layer_rope=(0,) * n,
        layer_windows=(None,) * n, query_pre_attn_scalar=head_dim / 2, max_positions=max_pos,
        layer_mixers=("mamba2",) * n, mixers=(mc,), layer_mlp=(False,) * n,
        shared_block=shared, layer_shared=tuple(next(j) if h else None for h in hybrid))


ZAMBA2_READS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "hidden_act", "rms_norm_eps",
    "tie_word_embeddings", "layers_block_type", "layer_types", "use_shared_attention_adapter",
    "add_bias_linear", "num_mem_blocks", "adapter_rank", "use_mem_rope", "use_long_context",
    "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
    "original_max_position_embeddings", *ZAMBA2_MAMBA2_KEYS.values()})
#: Keys that initialise, train or pick a kernel; ``use_conv_bias``: transformers' Zamba2
#: convolution always has a bias, whatever it says.
ZAMBA2_HARMLESS = frozenset({
    "use_mamba_kernels", "use_mem_eff_path", "chunk_size", "time_step_max", "time_step_floor",
    "num_logits_to_keep", "use_conv_bias"})
#: Values transformers derives and writes back (it recomputes them when it reads the file,
#: so only the derived value is what it runs), and the original checkpoints' MLP-adapter
#: switch (transformers always has the adapters).
ZAMBA2_NEUTRAL = {
    "attention_hidden_size": Derived("2 * hidden_size", lambda c: 2 * c.hidden_size),
    "attention_head_dim": Derived("2 * hidden_size / num_attention_heads",
                                  lambda c: c.head_dim),
    "head_dim": Derived("2 * hidden_size / num_attention_heads", lambda c: c.head_dim),
    "kv_channels": Derived("hidden_size / num_attention_heads",
                           lambda c: c.hidden_size // c.num_heads),
    "num_query_groups": Derived("num_attention_heads", lambda c: c.num_heads),
    "hybrid_layer_ids": Derived("the indices of the hybrid layers", lambda c: [
        i for i, j in enumerate(c.layer_shared) if j is not None]),
    "use_shared_mlp_adapter": True}
