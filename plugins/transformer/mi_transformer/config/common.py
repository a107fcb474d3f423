"""Parsing helpers shared by the family parsers: activations, RoPE (both spellings: the
hub's ``rope_theta`` / ``rope_scaling`` and transformers 5's ``rope_parameters``, optionally
nested per layer type), heads, the LLaMA-style scalars (:func:`_base`) and the per-layer
rope / window tuples (:func:`_finish`)."""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs

from mi_core.plugin import ConfigError

from mi_transformer.config.axes import Activation, RopeConfig, RopeScaling, TransformerConfig
from mi_transformer.config.reader import _REQUIRED, ConfigReader
from mi_transformer.config.size import check_parsed

_ACTIVATIONS = {
    "silu": Activation.SILU, "swish": Activation.SILU,
    "gelu_pytorch_tanh": Activation.GELU_TANH, "gelu_new": Activation.GELU_TANH,
    "gelu_fast": Activation.GELU_TANH,
    "gelu": Activation.GELU,
    "relu": Activation.RELU,
    "relu2": Activation.RELU2,
}


def _activation(r: ConfigReader, key: str, default: str,
                legacy_gelu_is_tanh: bool = False) -> Activation:
    name = r.str(key, default, choices=_ACTIVATIONS)
    if legacy_gelu_is_tanh and name == "gelu":  # Gemma's legacy spelling, as transformers maps it
        name = "gelu_pytorch_tanh"
    return _ACTIVATIONS[name]


#: rope dict keys per type (besides rope_type / type / rope_theta / partial_rotary_factor).
_ROPE_KEYS = {"default": set(), "linear": {"factor"},
              "llama3": {"factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"},
              "dynamic": {"factor", "original_max_position_embeddings"},
              "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                       "truncate", "mscale", "mscale_all_dim", "attention_factor"},
              "longrope": {"factor", "original_max_position_embeddings", "short_factor",
                           "long_factor", "attention_factor"}}


#: A family's reader of keys it allows inside the RoPE dict beyond :data:`_ROPE_KEYS` (it
#: reads and checks them on the dict's reader; Qwen3.5's mRoPE sections).
RopeExtra = Callable[[ConfigReader], None]


def _rope(r: ConfigReader, key: str, theta: float | None, max_pos: int | None,
          top_original: int | None = None, extra_keys: RopeExtra | None = None) -> RopeConfig:
    """One RoPE from a `rope_parameters`-style or `rope_scaling`-style dict plus a base.

    `top_original`: a top-level ``original_max_position_embeddings`` (Phi-3), which
    transformers prefers over the dict's for llama3 / yarn / longrope. `extra_keys`: reads
    the family's own keys in the dict (anything else unknown is refused)."""
    params = r.mapping(key) if key in r.cfg else None
    p = r.sub(key, params or {})
    legacy = p.str("type", None)  # transformers 5 keeps the old spelling beside rope_type
    kind = p.str("rope_type", None) or legacy or "default"
    if kind not in _ROPE_KEYS:
        raise ConfigError(f"{p.src}: unsupported RoPE scaling type {kind!r} (supported: "
                          f"{', '.join(_ROPE_KEYS)})")
    theta = p.float("rope_theta", theta if theta is not None else 10000.0, gt=0)
    p.float("partial_rotary_factor", None, gt=0, le=1)  # read by the caller
    if extra_keys is not None:
        extra_keys(p)
    extra = p.unread(_ROPE_KEYS[kind])
    if extra:
        raise ConfigError(f"{p.src}: keys {extra} are not understood for RoPE type {kind!r}")
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind in ("yarn", "longrope"):
        return _rope_long(p, kind, theta, max_pos, top_original)
    factor = p.float("factor", gt=0)
    if kind == "linear":
        return RopeConfig(theta=theta, scaling=RopeScaling.LINEAR, factor=factor)
    if kind == "llama3":
        low, high = p.float("low_freq_factor", gt=0), p.float("high_freq_factor", gt=0)
        if high < low:  # equal: no medium band, a step (Llama 4; transformers only warns)
            raise ConfigError(f"{p.src}: high_freq_factor {high} must be at least "
                              f"low_freq_factor {low}")
        return RopeConfig(theta=theta, scaling=RopeScaling.LLAMA3, factor=factor,
                          low_freq_factor=low, high_freq_factor=high,
                          original_max_positions=top_original or p.int(
                              "original_max_position_embeddings", max_pos or 8192))
    omp = p.int("original_max_position_embeddings", max_pos)
    if not omp:
        raise ConfigError(f"{p.src}: dynamic RoPE needs max_position_embeddings")
    return RopeConfig(theta=theta, scaling=RopeScaling.DYNAMIC, factor=factor,
                      original_max_positions=omp)


def _rope_long(p: ConfigReader, kind: str, theta: float, max_pos: int | None,
               top_original: int | None) -> RopeConfig:
    """yarn / longrope, resolved as transformers' ``standardize_rope_params`` and rope init
    functions do: the original length defaults to max_position_embeddings, a missing longrope
    factor to max_position_embeddings / original length (Phi-3's convention)."""
    orig = top_original or p.int("original_max_position_embeddings", max_pos)
    if not orig:
        raise ConfigError(f"{p.src}: {kind} RoPE needs original_max_position_embeddings "
                          f"(or max_position_embeddings)")
    factor = p.float("factor", None if kind == "longrope" else _REQUIRED, gt=0)
    if factor is None:
        if not max_pos:
            raise ConfigError(f"{p.src}: longrope without 'factor' needs max_position_embeddings")
        factor = max_pos / orig
    common = dict(theta=theta, factor=factor, original_max_positions=orig,
                  attention_factor=p.float("attention_factor", None, gt=0))
    if kind == "yarn":
        return RopeConfig(scaling=RopeScaling.YARN, truncate=p.bool("truncate", True),
                          beta_fast=p.float("beta_fast", 32.0),
                          beta_slow=p.float("beta_slow", 1.0), mscale=p.float("mscale", None),
                          mscale_all_dim=p.float("mscale_all_dim", None), **common)
    factors = {}
    for key in ("short_factor", "long_factor"):
        v = p.list(key)
        if not v or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                            and math.isfinite(x) and x > 0 for x in v):
            raise p.bad(key, v, "a non-empty list of positive numbers")
        factors[key] = tuple(float(x) for x in v)
    return RopeConfig(scaling=RopeScaling.LONGROPE, **factors, **common)


_LAYER_TYPE_KEYS = ("full_attention", "sliding_attention")


def _ropes_by_type(r: ConfigReader, local_theta_key: str | None = None,
                   theta_key: str = "rope_theta", extra_keys: RopeExtra | None = None
                   ) -> dict[str, RopeConfig]:
    """{"full_attention": RopeConfig, "sliding_attention": RopeConfig} from either format
    (`extra_keys`: see :func:`_rope`)."""
    max_pos = r.int("max_position_embeddings", None)
    theta = r.float(theta_key, None, gt=0)
    params = r.mapping("rope_parameters")
    if params and any(k in params for k in _LAYER_TYPE_KEYS):  # transformers 5, nested
        sub = r.sub("rope_parameters", params)
        extra = sorted(set(params) - set(_LAYER_TYPE_KEYS))
        if extra:
            raise ConfigError(f"{sub.src}: keys {extra} are not understood")
        out = {k: _rope(sub, k, theta, max_pos, extra_keys=extra_keys) for k in _LAYER_TYPE_KEYS
               if sub.mapping(k) is not None}
        out.setdefault("full_attention", out.get("sliding_attention", RopeConfig()))
        out.setdefault("sliding_attention", out["full_attention"])
        return out
    top_original = r.int("original_max_position_embeddings", None)
    if params:  # transformers 5, flat
        glob = _rope(r, "rope_parameters", theta, max_pos, top_original, extra_keys)
    else:  # hub format: rope_theta + rope_scaling
        glob = _rope(r, "rope_scaling", theta, max_pos, top_original, extra_keys)
    local = glob
    if local_theta_key is not None and not params:
        # Gemma 3 hub format: local layers use `rope_local_base_freq` and no scaling.
        local = RopeConfig(theta=r.float(local_theta_key, 10000.0, gt=0))
    return {"full_attention": glob, "sliding_attention": local}


def _partial_rotary(r: ConfigReader, head_dim: int, *legacy: str) -> int:
    """Rotated dims from `partial_rotary_factor` (top level or inside rope_parameters) or a
    legacy spelling (`rotary_pct`); 0 means all of head_dim. transformers truncates."""
    params = r.mapping("rope_parameters") or {}
    frac = None
    for key in ("partial_rotary_factor", *legacy):
        frac = r.float(key, None, gt=0, le=1)
        if frac is not None:
            break
    if frac is None and "partial_rotary_factor" in params:
        frac = r.sub("rope_parameters", params).float("partial_rotary_factor", gt=0, le=1)
    if frac is None or frac == 1.0:
        return 0
    dims = int(head_dim * frac)
    if dims < 2 or dims % 2:
        raise ConfigError(f"{r.src}: partial rotary factor {frac} of head_dim {head_dim} gives "
                          f"{dims} rotated dims (must be even and >= 2)")
    return dims


def _layer_types(r: ConfigReader, n: int, default: Callable[[int], bool]) -> list[str]:
    lt = r.list("layer_types")
    if lt is not None:
        return list(lt)
    return ["sliding_attention" if default(i) else "full_attention" for i in range(n)]


def _finish(r: ConfigReader, base: dict[str, Any], types: list[str],
            ropes: dict[str, RopeConfig], window: int | None) -> TransformerConfig:
    """Turn per-layer type names into the rope/window tuples and build the config."""
    n = base["num_layers"]
    if len(types) != n:
        raise ConfigError(f"{r.src}: layer_types has {len(types)} entries, num_hidden_layers "
                          f"is {n}")
    bad = sorted({repr(t) for t in types if t not in _LAYER_TYPE_KEYS})
    if bad:
        raise ConfigError(f"{r.src}: layer_types has unsupported entries {bad}")
    r.refuse_unless("use_bidirectional_attention", False, "causal attention only")
    order = list(dict.fromkeys(ropes[t] for t in _LAYER_TYPE_KEYS))
    return TransformerConfig(
        ropes=tuple(order),
        layer_rope=tuple(order.index(ropes[t]) for t in types),
        layer_windows=tuple(window if (t == "sliding_attention" and window) else None
                            for t in types),
        **base)


def _heads(r: ConfigReader, hidden: int, heads_key: str, kv_key: str | None,
           head_dim_key: str | None = "head_dim") -> tuple[int, int, int]:
    """(heads, kv heads, head_dim) with their relations checked on the JSON keys."""
    heads = r.int(heads_key)
    kv = r.int(kv_key, heads) if kv_key else heads
    if heads % kv:
        raise ConfigError(f"{r.src}: {heads_key} = {heads} is not a multiple of {kv_key} = {kv}")
    head_dim = r.int(head_dim_key, None) if head_dim_key else None
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(f"{r.src}: hidden size {hidden} is not a multiple of {heads_key} "
                              f"= {heads} (and no head_dim is given)")
        head_dim = hidden // heads
    return heads, kv, head_dim


def _base(r: ConfigReader, model_type: str, eps_key: str = "rms_norm_eps",
          eps_default: float = 1e-6, act_default: str = "silu",
          tie_default: bool = False) -> dict[str, Any]:
    """The scalars every LLaMA-like config has, under their usual names."""
    hidden = r.int("hidden_size")
    heads, kv, head_dim = _heads(r, hidden, "num_attention_heads", "num_key_value_heads")
    base = dict(
        model_type=model_type,
        vocab_size=r.int("vocab_size"),
        hidden_size=hidden,
        num_layers=r.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=r.int("intermediate_size"),
        norm_eps=r.float(eps_key, eps_default, gt=0),
        activation=_activation(r, "hidden_act", act_default),
        tie_word_embeddings=r.bool("tie_word_embeddings", tie_default),
        rotary_dim=_partial_rotary(r, head_dim),
        max_positions=r.int("max_position_embeddings", None),
    )
    check_parsed(r, base, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "num_key_value_heads", "head_dim", "intermediate_size"))
    return base


def _all_sliding(r: ConfigReader, base: dict[str, Any]) -> TransformerConfig:
    """Families where a non-null `sliding_window` applies to every layer."""
    window = r.int("sliding_window", None)
    types = ["sliding_attention" if window else "full_attention"] * base["num_layers"]
    return _finish(r, base, types, _ropes_by_type(r), window)


def _full(r: ConfigReader, base: dict[str, Any]) -> TransformerConfig:
    types = ["full_attention"] * base["num_layers"]
    return _finish(r, base, types, _ropes_by_type(r), None)


def _default_theta(r: ConfigReader, ropes: dict[str, RopeConfig], theta: float
                   ) -> dict[str, RopeConfig]:
    """A family whose transformers config defaults rope_theta to something other than 1e4."""
    if not r.has("rope_parameters") and not r.has("rope_theta"):
        return {k: attrs.evolve(v, theta=theta) for k, v in ropes.items()}
    return ropes
