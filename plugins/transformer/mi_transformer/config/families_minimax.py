"""Parser of MiniMax (``minimax``, MiniMax-Text-01): lightning-attention layers (mi-ssm's
``lightning_attention`` mixer) interleaved with softmax attention, a mixture of experts after
every layer, and MiniMax's residual arithmetic.

Each sublayer's residual is its norm's output (``norm_residual``), scaled:
``x = alpha * ln1(x) + beta * mixer(ln1(x))``, then ``x = alpha_m * ln2(x) + beta_m *
moe(ln2(x))``, alpha / beta from ``full_attn_*_factor`` or ``linear_attn_*_factor`` by the
layer's type and ``mlp_*_factor`` (``layer_residual_scales``). The schedule is
``layer_types`` ("linear_attention" / "full_attention"; absent: transformers' default,
attention on the even layers). The attention layers are Mixtral's (GQA, RoPE over the whole
head, no biases; ``sliding_window`` where set); the MoE is Mixtral's (softmax over every
expert, top-k renormalised, experts ``block_sparse_moe.experts.{e}.w1 / w3 / w2``). A family
is this parser, the mixer's key table and the weight-name table ``minimax``.
"""

from __future__ import annotations

from typing import Any

from mi_core.plugin import ConfigError, UnsupportedModelError, mixer

from mi_transformer.config.axes import ATTENTION, MixerConfig, TransformerConfig
from mi_transformer.config.common import _base, _default_theta, _finish, _ropes_by_type
from mi_transformer.config.families_moe import _moe
from mi_transformer.config.neutral import ROTARY_DIM
from mi_transformer.config.reader import ConfigReader

LIGHTNING = "lightning_attention"
#: Mixer setting -> MiniMax's config key (mi_ssm.lightning reads them).
LIGHTNING_KEYS: dict[str, str] = {
    "heads": "num_attention_heads", "head_dim": "head_dim", "block_size": "block_size",
    "act": "hidden_act"}
#: transformers' layer_types spellings -> our layer types
_TYPES = {"linear_attention": LIGHTNING, "full_attention": ATTENTION}
#: the residual factors, per sublayer kind: (alpha key, beta key)
_FACTORS = {"full_attention": ("full_attn_alpha_factor", "full_attn_beta_factor"),
            "linear_attention": ("linear_attn_alpha_factor", "linear_attn_beta_factor"),
            "mlp": ("mlp_alpha_factor", "mlp_beta_factor")}


def _lightning_spec(r: ConfigReader) -> Any:
    try:
        return mixer(LIGHTNING, f"{r.src}: model_type 'minimax'")
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{exc}; the linear-attention mixers come with mi-ssm (pip "
                                    f"install 'mi-core[ssm]')") from None


def _types(r: ConfigReader, n: int) -> list[str]:
    types = r.list("layer_types")
    if types is None:  # transformers' MiniMaxConfig default
        types = ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n)]
    if len(types) != n:
        raise ConfigError(f"{r.src}: layer_types has {len(types)} entries, num_hidden_layers "
                          f"is {n}")
    bad = sorted({repr(t) for t in types if t not in _TYPES})
    if bad:
        raise ConfigError(f"{r.src}: layer_types has unsupported entries {bad} (supported: "
                          f"{sorted(_TYPES)})")
    return list(types)


def parse_minimax(r: ConfigReader) -> TransformerConfig:
    """MiniMax: ``x = a * ln1(x) + b * mixer(ln1(x))`` (lightning or softmax attention), then
    ``x = a_m * ln2(x) + b_m * moe(ln2(x))``."""
    base = _base(r, "minimax", eps_default=1e-5)
    n, hidden = base["num_layers"], base["hidden_size"]
    if base["rotary_dim"]:  # transformers' MiniMax rotary embedding always spans the head
        raise ConfigError(f"{r.src}: partial_rotary_factor is not supported for minimax "
                          f"(transformers rotates the whole head: only 1.0 is)")
    types = _types(r, n)
    spec = _lightning_spec(r)
    settings = spec.settings(r, LIGHTNING_KEYS, hidden)
    factor = {k: (r.float(a, 1.0), r.float(b, 1.0)) for k, (a, b) in _FACTORS.items()}
    moe = _moe(r, ("num_local_experts", "num_experts"), "intermediate_size", None,
               block="block_sparse_moe", expert_names=("w1", "w3", "w2"),
               accumulate_float32=True)
    window = r.int("sliding_window", None)
    base.update(weight_names="minimax", moe=moe, layer_moe=(True,) * n,
                layer_mixers=tuple(_TYPES[t] for t in types),
                mixers=(MixerConfig(LIGHTNING, spec, settings),), norm_residual=True,
                layer_residual_scales=tuple(factor[t] + factor["mlp"] for t in types))
    attn = ["sliding_attention" if window else "full_attention"] * n
    return _finish(r, base, attn, _default_theta(r, _ropes_by_type(r), 1_000_000.0), window)


MINIMAX_READS = frozenset({
    "layer_types", "block_size", "sliding_window", "num_local_experts", "num_experts",
    "num_experts_per_tok", *(k for pair in _FACTORS.values() for k in pair)})
#: MiniMax's training-only keys (the router's auxiliary loss and noise)
MINIMAX_HARMLESS = frozenset({"output_router_logits", "router_aux_loss_coef",
                              "router_jitter_noise"})
#: Keys of the released MiniMax-Text-01(-hf) config that transformers' MiniMax never reads,
#: at the values it always implements: ``postnorm`` (the residual is the normed input, as
#: here), no shared expert (``shared_intermediate_size`` 0; its ``shared_moe_mode`` then
#: selects nothing) and a ``rotary_dim`` equal to the width it rotates, the whole head (the
#: release's 64 of 128 is refused: transformers would rotate all 128).
MINIMAX_NEUTRAL: dict[str, Any] = {"postnorm": True, "shared_intermediate_size": 0,
                                   "shared_moe_mode": "sigmoid", "rotary_dim": ROTARY_DIM}
