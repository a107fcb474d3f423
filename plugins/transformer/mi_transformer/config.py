"""`TransformerConfig`: every way the supported decoder-only families differ, as typed axes.

A family is a parser from its ``config.json`` to these axes (one function per family,
registered in :data:`FAMILY_PARSERS`); the forward pass only ever reads the axes. Both
config formats are accepted: the one on the hub (``rope_theta`` / ``rope_scaling``) and the
one transformers 5 writes (``rope_parameters``, optionally nested per layer type).
"""

from __future__ import annotations

import enum
import math
from typing import Any, Callable, Mapping

import attrs

from mi_core.errors import ConfigError
from mi_core.loading import require_field


class NormType(enum.Enum):
    RMS = "rms"  # x / rms(x) * w
    GEMMA_RMS = "gemma_rms"  # x / rms(x) * (1 + w)
    LAYER_NORM = "layer_norm"  # (x - mean) / std * w + b


class Activation(enum.Enum):
    SILU = "silu"
    GELU_TANH = "gelu_tanh"
    GELU = "gelu"


class QkvLayout(enum.Enum):
    SEPARATE = "separate"  # q_proj, k_proj, v_proj
    FUSED = "fused"  # qkv_proj, rows [q | k | v]


class MlpLayout(enum.Enum):
    GATED = "gated"  # down(act(gate(x)) * up(x))
    GATED_FUSED = "gated_fused"  # gate_up_proj, rows [gate | up]
    PLAIN = "plain"  # c_proj(act(c_fc(x)))


class RopeScaling(enum.Enum):
    NONE = "default"
    LINEAR = "linear"
    LLAMA3 = "llama3"
    DYNAMIC = "dynamic"  # NTK-aware: base grows with the longest position of each call


@attrs.frozen
class RopeConfig:
    """One rotary embedding: base, scaling, and the fraction of d_head it rotates."""

    theta: float = 10000.0
    scaling: RopeScaling = RopeScaling.NONE
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_positions: int = 8192  # llama3; dynamic (its max_position_embeddings)


@attrs.frozen
class TransformerConfig:
    """The axes the generic forward pass reads. Per-layer tuples have `num_layers` entries."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_type: NormType = NormType.RMS
    norm_eps: float = 1e-6
    activation: Activation = Activation.SILU
    qkv_layout: QkvLayout = QkvLayout.SEPARATE
    mlp_layout: MlpLayout = MlpLayout.GATED
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False  # LayerNorm with a bias
    embedding_scale: float | None = None  # Gemma: sqrt(hidden_size)
    tie_word_embeddings: bool = False
    rotary_dim: int = 0  # rotated leading dims of each head (0 -> head_dim)
    ropes: tuple[RopeConfig, ...] = (RopeConfig(),)
    layer_rope: tuple[int, ...] = ()  # index into `ropes` per layer
    layer_windows: tuple[int | None, ...] = ()  # sliding window per layer (None = full)
    qk_norm: bool = False  # RMS-norm q and k per head before RoPE (Qwen3, Gemma 3)
    attn_softcap: float | None = None  # cap * tanh(scores / cap)
    final_softcap: float | None = None  # the same on the logits
    post_norms: bool = False  # norms on the attention / MLP outputs (Gemma 2/3)
    query_pre_attn_scalar: float | None = None  # scores scaled by this**-0.5 (else head_dim)
    max_positions: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{self.model_type}: num_attention_heads {self.num_heads} is not a "
                              f"multiple of num_key_value_heads {self.num_kv_heads}")
        for name, seq in (("layer_rope", self.layer_rope), ("layer_windows", self.layer_windows)):
            if len(seq) != self.num_layers:
                raise ConfigError(f"{self.model_type}: {name} has {len(seq)} entries for "
                                  f"{self.num_layers} layers")

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def rot_dim(self) -> int:
        return self.rotary_dim or self.head_dim


# ----------------------------------------------------------------------------------------
# Parsing helpers shared by the family parsers
# ----------------------------------------------------------------------------------------

_ACTIVATIONS = {
    "silu": Activation.SILU, "swish": Activation.SILU,
    "gelu_pytorch_tanh": Activation.GELU_TANH, "gelu_new": Activation.GELU_TANH,
    "gelu_fast": Activation.GELU_TANH,
    "gelu": Activation.GELU,
}


def _activation(cfg: Mapping[str, Any], src: str, legacy_gelu_is_tanh: bool = False) -> Activation:
    name = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if legacy_gelu_is_tanh and name == "gelu":  # Gemma's legacy spelling, as transformers maps it
        name = "gelu_pytorch_tanh"
    if name not in _ACTIVATIONS:
        raise ConfigError(f"{src}: unsupported activation {name!r} "
                          f"(supported: {', '.join(sorted(_ACTIVATIONS))})")
    return _ACTIVATIONS[name]


def _rope(params: Mapping[str, Any] | None, theta: float | None, max_pos: int | None,
          src: str, what: str = "rope") -> RopeConfig:
    """One RoPE from a `rope_parameters`-style or `rope_scaling`-style dict plus a base."""
    p = dict(params or {})
    kind = p.get("rope_type", p.get("type", "default")) or "default"
    theta = float(p.get("rope_theta", theta if theta is not None else 10000.0))
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, scaling=RopeScaling.LINEAR, factor=float(p["factor"]))
    if kind == "llama3":
        try:
            return RopeConfig(
                theta=theta, scaling=RopeScaling.LLAMA3, factor=float(p["factor"]),
                low_freq_factor=float(p["low_freq_factor"]),
                high_freq_factor=float(p["high_freq_factor"]),
                original_max_positions=int(p.get("original_max_position_embeddings") or max_pos or 8192))
        except KeyError as exc:
            raise ConfigError(f"{src}: {what} of type llama3 lacks field {exc.args[0]!r}") from None
    if kind == "dynamic":
        if not max_pos:
            raise ConfigError(f"{src}: dynamic RoPE needs max_position_embeddings")
        return RopeConfig(theta=theta, scaling=RopeScaling.DYNAMIC, factor=float(p["factor"]),
                          original_max_positions=int(max_pos))
    raise ConfigError(f"{src}: unsupported RoPE scaling type {kind!r} (supported: default, "
                      f"linear, llama3, dynamic)")


_LAYER_TYPE_KEYS = ("full_attention", "sliding_attention")


def _ropes_by_type(cfg: Mapping[str, Any], src: str,
                   local_theta_key: str | None = None) -> dict[str, RopeConfig]:
    """{"full_attention": RopeConfig, "sliding_attention": RopeConfig} from either format."""
    max_pos = cfg.get("max_position_embeddings")
    theta = cfg.get("rope_theta")
    params = cfg.get("rope_parameters")
    if params and any(k in params for k in _LAYER_TYPE_KEYS):  # transformers 5, nested
        out = {k: _rope(v, theta, max_pos, src, f"rope_parameters[{k!r}]")
               for k, v in params.items() if k in _LAYER_TYPE_KEYS and v is not None}
        out.setdefault("full_attention", out.get("sliding_attention", RopeConfig()))
        out.setdefault("sliding_attention", out["full_attention"])
        return out
    if params:  # transformers 5, flat
        glob = _rope(params, theta, max_pos, src, "rope_parameters")
    else:  # hub format: rope_theta + rope_scaling
        glob = _rope(cfg.get("rope_scaling"), theta, max_pos, src, "rope_scaling")
    local = glob
    if local_theta_key is not None and not params:
        # Gemma 3 hub format: local layers use `rope_local_base_freq` and no scaling.
        local = RopeConfig(theta=float(cfg.get(local_theta_key, 10000.0)))
    return {"full_attention": glob, "sliding_attention": local}


def _layer_types(cfg: Mapping[str, Any], n: int, default: Callable[[int], bool]) -> list[str]:
    lt = cfg.get("layer_types")
    if lt is not None:
        return list(lt)
    return ["sliding_attention" if default(i) else "full_attention" for i in range(n)]


def _finish(cfg: Mapping[str, Any], src: str, base: dict[str, Any], types: list[str],
            ropes: dict[str, RopeConfig], window: int | None) -> TransformerConfig:
    """Turn per-layer type names into the rope/window tuples and build the config."""
    n = base["num_layers"]
    if len(types) != n:
        raise ConfigError(f"{src}: layer_types has {len(types)} entries, num_hidden_layers is {n}")
    bad = sorted(set(types) - set(_LAYER_TYPE_KEYS))
    if bad:
        raise ConfigError(f"{src}: unsupported layer types {bad}")
    if cfg.get("use_bidirectional_attention"):
        raise ConfigError(f"{src}: use_bidirectional_attention is not supported (causal only)")
    order = list(dict.fromkeys(ropes[t] for t in _LAYER_TYPE_KEYS))
    return TransformerConfig(
        ropes=tuple(order),
        layer_rope=tuple(order.index(ropes[t]) for t in types),
        layer_windows=tuple(window if (t == "sliding_attention" and window) else None for t in types),
        **base)


def _base(cfg: Mapping[str, Any], src: str, model_type: str) -> dict[str, Any]:
    """The scalars every LLaMA-like config has, under their usual names."""
    hidden = int(require_field(cfg, "hidden_size", src))
    heads = int(require_field(cfg, "num_attention_heads", src))
    head_dim = cfg.get("head_dim") or hidden // heads
    rope_params = cfg.get("rope_parameters") or {}
    prf = cfg.get("partial_rotary_factor", rope_params.get("partial_rotary_factor", 1.0)) or 1.0
    return dict(
        model_type=model_type,
        vocab_size=int(require_field(cfg, "vocab_size", src)),
        hidden_size=hidden,
        num_layers=int(require_field(cfg, "num_hidden_layers", src)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        intermediate_size=int(require_field(cfg, "intermediate_size", src)),
        norm_eps=float(cfg.get("rms_norm_eps", cfg.get("norm_epsilon", 1e-6))),
        activation=_activation(cfg, src),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rotary_dim=int(int(head_dim) * float(prf)) if float(prf) != 1.0 else 0,
        max_positions=cfg.get("max_position_embeddings"),
    )


def _all_sliding(cfg: Mapping[str, Any], src: str, base: dict[str, Any]) -> TransformerConfig:
    """Families where a non-null `sliding_window` applies to every layer."""
    window = cfg.get("sliding_window")
    types = ["sliding_attention" if window else "full_attention"] * base["num_layers"]
    return _finish(cfg, src, base, types, _ropes_by_type(cfg, src), window)


# ----------------------------------------------------------------------------------------
# One parser per family
# ----------------------------------------------------------------------------------------

def parse_llama(cfg: Mapping[str, Any], src: str) -> TransformerConfig:
    base = _base(cfg, src, "llama")
    base.update(qkv_bias=bool(cfg.get("attention_bias", False)),
                o_bias=bool(cfg.get("attention_bias", False)),
                mlp_bias=bool(cfg.get("mlp_bias", False)))
    types = ["full_attention"] * base["num_layers"]
    return _finish(cfg, src, base, types, _ropes_by_type(cfg, src), None)


def parse_mistral(cfg: Mapping[str, Any], src: str) -> TransformerConfig:
    return _all_sliding(cfg, src, _base(cfg, src, "mistral"))


def _qwen(cfg: Mapping[str, Any], src: str, base: dict[str, Any]) -> TransformerConfig:
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    mwl = int(cfg.get("max_window_layers", 0) or 0)
    types = _layer_types(cfg, base["num_layers"], lambda i: window is not None and i >= mwl)
    return _finish(cfg, src, base, types, _ropes_by_type(cfg, src), window)


def parse_qwen2(cfg: Mapping[str, Any], src: str) -> TransformerConfig:
    base = _base(cfg, src, "qwen2")
    base.update(qkv_bias=True)
    return _qwen(cfg, src, base)


def parse_qwen3(cfg: Mapping[str, Any], src: str) -> TransformerConfig:
    base = _base(cfg, src, "qwen3")
    base.update(qkv_bias=bool(cfg.get("attention_bias", False)),
                o_bias=bool(cfg.get("attention_bias", False)), qk_norm=True)
    return _qwen(cfg, src, base)


def _gemma_base(cfg: Mapping[str, Any], src: str, model_type: str) -> dict[str, Any]:
    base = _base(cfg, src, model_type)
    base.update(norm_type=NormType.GEMMA_RMS,
                activation=_activation(cfg, src, legacy_gelu_is_tanh=True),
                embedding_scale=math.sqrt(base["hidden_size"]),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                qkv_bias=bool(cfg.get("attention_bias", False)),
                o_bias=bool(cfg.get("attention_bias", False)))
    return base


def parse_gemma(cfg: Mapping[str, Any], src: str) -> TransformerConfig:
    base = _gemma_base(cfg, src, "gemma")
    types = ["full_attention"] * base["num_layers"]
    return _finish(cfg, src, base, types, _ropes_by_type(cfg, src), None)


def parse_gemma2(cfg: Mapping[str, Any], src: str) -> TransformerConfig:
    base = _gemma_base(cfg, src, "gemma2")
    base.update(post_norms=True, attn_softcap=cfg.get("attn_logit_softcapping"),
                final_softcap=cfg.get("final_logit_softcapping"),
                query_pre_attn_scalar=cfg.get("query_pre_attn_scalar"))
    types = _layer_types(cfg, base["num_layers"], lambda i: i % 2 == 0)
    return _finish(cfg, src, base, types, _ropes_by_type(cfg, src), cfg.get("sliding_window"))


def parse_gemma3_text(cfg: Mapping[str, Any], src: str) -> TransformerConfig:
    base = _gemma_base(cfg, src, "gemma3_text")
    base.update(post_norms=True, qk_norm=True, attn_softcap=cfg.get("attn_logit_softcapping"),
                final_softcap=cfg.get("final_logit_softcapping"),
                query_pre_attn_scalar=cfg.get("query_pre_attn_scalar"))
    pattern = int(cfg.get("sliding_window_pattern", 6) or 6)
    types = _layer_types(cfg, base["num_layers"], lambda i: bool((i + 1) % pattern))
    ropes = _ropes_by_type(cfg, src, local_theta_key="rope_local_base_freq")
    if not cfg.get("rope_parameters") and cfg.get("rope_theta") is None:
        ropes["full_attention"] = attrs.evolve(ropes["full_attention"], theta=1_000_000.0)
    return _finish(cfg, src, base, types, ropes, cfg.get("sliding_window"))


def parse_phi3(cfg: Mapping[str, Any], src: str) -> TransformerConfig:
    base = _base(cfg, src, "phi3")
    base.update(qkv_layout=QkvLayout.FUSED, mlp_layout=MlpLayout.GATED_FUSED)
    return _all_sliding(cfg, src, base)


def parse_starcoder2(cfg: Mapping[str, Any], src: str) -> TransformerConfig:
    base = _base(cfg, src, "starcoder2")
    bias = bool(cfg.get("use_bias", True))
    base.update(norm_type=NormType.LAYER_NORM, norm_bias=True, mlp_layout=MlpLayout.PLAIN,
                qkv_bias=bias, o_bias=bias, mlp_bias=bias,
                norm_eps=float(cfg.get("norm_epsilon", 1e-5)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)))
    return _all_sliding(cfg, src, base)


#: model_type -> parser. A new family is one entry here (see docs/BACKENDS.md).
FAMILY_PARSERS: dict[str, Callable[[Mapping[str, Any], str], TransformerConfig]] = {
    "llama": parse_llama,
    "mistral": parse_mistral,
    "qwen2": parse_qwen2,
    "qwen3": parse_qwen3,
    "gemma": parse_gemma,
    "gemma2": parse_gemma2,
    "gemma3_text": parse_gemma3_text,
    "phi3": parse_phi3,
    "starcoder2": parse_starcoder2,
}


def parse_config(cfg: Mapping[str, Any], src: str = "config.json",
                 tensor_names: list[str] | None = None) -> TransformerConfig:
    """The family's parser for a known `model_type`, else :func:`auto_config`."""
    mt = require_field(cfg, "model_type", src)
    parser = FAMILY_PARSERS.get(mt)
    if parser is not None:
        return parser(cfg, src)
    return auto_config(cfg, src, tensor_names or [])


def auto_config(cfg: Mapping[str, Any], src: str, tensor_names: list[str]) -> TransformerConfig:
    """A LLaMA-like config for an unknown `model_type`, layouts read off the tensor names.

    RMS norm, RoPE, gated MLP; fused/separate QKV and gate/up, biases and q/k norms are
    taken from which tensors exist. Whether the tensors then match is checked by
    :func:`mi_transformer.weights.expected_shapes` (detection lists missing/unexpected).
    """
    names = set(tensor_names)
    base = _base(cfg, src, str(cfg.get("model_type")))
    has = lambda suffix: f"model.layers.0.{suffix}" in names  # noqa: E731
    base.update(
        qkv_layout=QkvLayout.FUSED if has("self_attn.qkv_proj.weight") else QkvLayout.SEPARATE,
        mlp_layout=MlpLayout.GATED_FUSED if has("mlp.gate_up_proj.weight") else MlpLayout.GATED,
        qkv_bias=has("self_attn.q_proj.bias") or has("self_attn.qkv_proj.bias"),
        o_bias=has("self_attn.o_proj.bias"),
        mlp_bias=has("mlp.down_proj.bias"),
        qk_norm=has("self_attn.q_norm.weight"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", "lm_head.weight" not in names)),
    )
    return _all_sliding(cfg, src, base)
