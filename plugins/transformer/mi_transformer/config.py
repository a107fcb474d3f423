"""`TransformerConfig`: every way the supported decoder-only families differ, as typed axes.

A family is a parser from its ``config.json`` to these axes plus the list of keys it reads
(:class:`Family`, registered in :data:`FAMILIES`); the forward pass only ever reads the axes.
Parsing is strict (:class:`ConfigReader`): a value of the wrong JSON type or out of range is a
``ConfigError`` naming the key, the value and the file (``"false"`` is not a bool, ``2.7`` is
not an int), and a key that is neither read by the family nor known to be harmless is refused,
so no key that changes the numbers is ever silently ignored. Both rope spellings are accepted:
the hub's (``rope_theta`` / ``rope_scaling``) and the one transformers 5 writes
(``rope_parameters``, optionally nested per layer type).
"""

from __future__ import annotations

import enum
import math
from typing import Any, Callable, Iterable, Mapping

import attrs

from mi_core.configread import REQUIRED, ConfigFields
from mi_core.errors import ConfigError


class NormType(enum.Enum):
    RMS = "rms"  # x / rms(x) * w
    GEMMA_RMS = "gemma_rms"  # x / rms(x) * (1 + w)
    LAYER_NORM = "layer_norm"  # (x - mean) / std * w (+ b)


class Activation(enum.Enum):
    SILU = "silu"
    GELU_TANH = "gelu_tanh"
    GELU = "gelu"
    RELU = "relu"


class QkvLayout(enum.Enum):
    """How a checkpoint stores the q/k/v projections (torch.nn.Linear rows unless noted)."""

    SEPARATE = "separate"  # q_proj, k_proj, v_proj
    FUSED = "fused"  # one tensor, rows [q | k | v] (Phi-3; Falcon multi-query)
    CONV1D = "conv1d"  # GPT-2 Conv1D: [d_model, q | k | v], i.e. FUSED transposed
    HEAD_INTERLEAVED = "head_interleaved"  # GPT-NeoX: rows [h0: q k v | h1: q k v | ...]
    GROUPED = "grouped"  # Falcon new decoder: per KV head [q * (h / kv) | k | v]


class MlpLayout(enum.Enum):
    GATED = "gated"  # down(act(gate(x)) * up(x))
    GATED_FUSED = "gated_fused"  # gate_up_proj, rows [gate | up]
    PLAIN = "plain"  # c_proj(act(c_fc(x)))


class Positions(enum.Enum):
    ROPE = "rope"  # rotary embedding of q and k
    LEARNED = "learned"  # a learned absolute position embedding added to the token embedding


class RopeLayout(enum.Enum):
    HALF = "half"  # GPT-NeoX / LLaMA: rotate the two halves of the rotated dims
    INTERLEAVED = "interleaved"  # GPT-J: rotate pairs of adjacent dims


class BlockLayout(enum.Enum):
    SEQUENTIAL = "sequential"  # x += attn(ln1(x)); x += mlp(ln2(x))
    PARALLEL = "parallel"  # x += attn(ln1(x)) + mlp(ln2(x))   (two norms: NeoX, Falcon-40B)
    PARALLEL_SHARED_NORM = "parallel_shared_norm"  # h = ln1(x); x += attn(h) + mlp(h)  (GPT-J)


class RopeScaling(enum.Enum):
    NONE = "default"
    LINEAR = "linear"
    LLAMA3 = "llama3"
    DYNAMIC = "dynamic"  # NTK-aware: base grows with the longest position of each call
    YARN = "yarn"  # interpolate low frequencies, keep high ones, scale cos/sin (Qwen2.5 long)
    LONGROPE = "longrope"  # per-frequency short/long factors, scale cos/sin (Phi-3 128k)


@attrs.frozen
class RopeConfig:
    """One rotary embedding: base and scaling."""

    theta: float = 10000.0
    scaling: RopeScaling = RopeScaling.NONE
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_positions: int = 8192  # llama3, yarn, longrope; dynamic (max_position_embeddings)
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: round the correction range outwards
    mscale: float | None = None  # yarn: attention factor as an mscale ratio (DeepSeek style)
    mscale_all_dim: float | None = None
    attention_factor: float | None = None  # yarn/longrope: cos/sin scale (None: derived)
    short_factor: tuple[float, ...] = ()  # longrope, one per rotated frequency
    long_factor: tuple[float, ...] = ()  # longrope, once positions pass the original length

    @property
    def position_dependent(self) -> bool:
        """Whether the frequencies depend on the longest position of a call."""
        return self.scaling in (RopeScaling.DYNAMIC, RopeScaling.LONGROPE)


@attrs.frozen
class MoeConfig:
    """A mixture-of-experts MLP: softmax router, top-k gated experts (mi_transformer.moe)."""

    num_experts: int
    top_k: int
    expert_size: int  # d_mlp of each routed expert
    norm_topk_prob: bool  # renormalise the top-k weights to sum to 1 (Mixtral: always)
    shared_expert_size: int = 0  # d_mlp of the always-on shared expert; 0 = none
    shared_expert_gate: bool = False  # sigmoid(gate(x)) scales the shared expert (Qwen2-MoE)
    # checkpoint names: the block module and each expert's (gate, up, down) projections
    block: str = "mlp"
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")

    def __attrs_post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ConfigError(f"MoE: num_experts_per_tok {self.top_k} must be in "
                              f"1..{self.num_experts} (the number of experts)")


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
    weight_names: str = "llama"  # key of mi_transformer.weights.NAME_TABLES
    norm_type: NormType = NormType.RMS
    norm_eps: float = 1e-6
    activation: Activation = Activation.SILU
    qkv_layout: QkvLayout = QkvLayout.SEPARATE
    mlp_layout: MlpLayout = MlpLayout.GATED
    block: BlockLayout = BlockLayout.SEQUENTIAL
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False  # LayerNorm with a bias
    lm_head_bias: bool = False  # GPT-J, Phi-1/2
    embedding_scale: float | None = None  # Gemma: sqrt(hidden_size)
    tie_word_embeddings: bool = False
    positions: Positions = Positions.ROPE
    position_offset: int = 0  # learned positions: row of position 0 (OPT: 2)
    rope_layout: RopeLayout = RopeLayout.HALF
    rotary_dim: int = 0  # rotated leading dims of each head (0 -> head_dim)
    ropes: tuple[RopeConfig, ...] = (RopeConfig(),)
    layer_rope: tuple[int, ...] = ()  # index into `ropes` per layer
    layer_windows: tuple[int | None, ...] = ()  # sliding window per layer (None = full)
    qk_norm: bool = False  # RMS-norm q and k per head before RoPE (Qwen3, Gemma 3)
    attn_softcap: float | None = None  # cap * tanh(scores / cap)
    final_softcap: float | None = None  # the same on the logits
    post_norms: bool = False  # norms on the attention / MLP outputs (Gemma 2/3)
    query_pre_attn_scalar: float | None = None  # scores scaled by this**-0.5 (else head_dim)
    attn_scaled: bool = True  # GPT-2 scale_attn_weights: False -> scores not scaled
    attn_scale_by_layer: bool = False  # GPT-2 scale_attn_by_inverse_layer_idx: / (layer + 1)
    max_positions: int | None = None
    # -- axes of the LLaMA-like families with twists (OLMo, OLMo2, Granite, SmolLM3, MoE) --
    qk_norm_full: bool = False  # q/k norms over the whole projection, not per head (OLMo2/OLMoE)
    clip_qkv: float | None = None  # clamp q, k, v to [-c, c] after the projections (OLMo)
    pre_norms: bool = True  # False: no norm before attention / MLP, post-norms only (OLMo2)
    norm_affine: bool = True  # False: norms without weights (OLMo's non-parametric LayerNorm)
    residual_scale: float = 1.0  # branch outputs scaled before the residual add (Granite)
    attn_multiplier: float | None = None  # scores scaled by this, not head_dim**-0.5 (Granite)
    logit_scale: float = 1.0  # logits multiplied by this (Granite: 1 / logits_scaling)
    layer_use_rope: tuple[bool, ...] = ()  # per layer, False = no positions (SmolLM3); () = all
    qk_norm_heads: bool = False  # q/k norm gains per head, [heads, d_head] (Cohere)
    moe: MoeConfig | None = None  # the mixture-of-experts MLP of the layers layer_moe marks
    layer_moe: tuple[bool, ...] = ()  # per layer, True = MoE MLP; () = all dense

    def __attrs_post_init__(self) -> None:
        """Relations between axes; the parsers check the same on JSON keys first, so this
        only fires for a config built by hand (or a parser bug)."""
        where = f"{self.model_type} config"
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{where}: {name} = {getattr(self, name)} must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{where}: num_heads {self.num_heads} is not a multiple of "
                              f"num_kv_heads {self.num_kv_heads}")
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise ConfigError(f"{where}: norm_eps = {self.norm_eps} must be > 0")
        for name, seq in (("layer_rope", self.layer_rope), ("layer_windows", self.layer_windows)):
            if len(seq) != self.num_layers:
                raise ConfigError(f"{where}: {name} has {len(seq)} entries for "
                                  f"{self.num_layers} layers")
        if any(w is not None and w < 1 for w in self.layer_windows):
            raise ConfigError(f"{where}: sliding windows {self.layer_windows} must be >= 1")
        if any(not 0 <= r < len(self.ropes) for r in self.layer_rope):
            raise ConfigError(f"{where}: layer_rope {self.layer_rope} indexes past "
                              f"{len(self.ropes)} ropes")
        if self.positions is Positions.ROPE and (
                self.rot_dim % 2 or not 0 < self.rot_dim <= self.head_dim):
            raise ConfigError(f"{where}: rotary dims {self.rot_dim} must be even and in "
                              f"1..head_dim {self.head_dim}")
        for rope in self.ropes:
            for key in ("short_factor", "long_factor"):
                n = len(getattr(rope, key))
                if rope.scaling is RopeScaling.LONGROPE and n != self.rot_dim // 2:
                    raise ConfigError(f"{where}: longrope {key} has {n} entries; the rotary "
                                      f"dimension {self.rot_dim} needs {self.rot_dim // 2}")
        for name, flags in (("layer_use_rope", self.layer_use_rope), ("layer_moe", self.layer_moe)):
            if flags and len(flags) != self.num_layers:
                raise ConfigError(f"{where}: {name} has {len(flags)} entries for "
                                  f"{self.num_layers} layers")
        if any(self.layer_moe) and self.moe is None:
            raise ConfigError(f"{where}: layer_moe marks MoE layers but no MoE config is given")
        if not self.pre_norms and not self.post_norms:
            raise ConfigError(f"{where}: a block needs pre-norms or post-norms")
        if self.positions is Positions.LEARNED and self.max_positions is None:
            raise ConfigError(f"{where}: learned positions need max_positions")
        for name in ("attn_softcap", "final_softcap", "query_pre_attn_scalar", "embedding_scale"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{where}: {name} = {v} must be > 0")

    @property
    def attn_scale(self) -> float:
        if not self.attn_scaled:
            return 1.0
        if self.attn_multiplier is not None:
            return self.attn_multiplier
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def rot_dim(self) -> int:
        return self.rotary_dim or self.head_dim


# ----------------------------------------------------------------------------------------
# Strict, typed access to config.json
# ----------------------------------------------------------------------------------------

_REQUIRED: Any = REQUIRED


class ConfigReader(ConfigFields):
    """Typed access to one config dict; remembers every key it was asked for.

    No coercion: an int field takes a JSON integer (not a bool, not 2.0), a float field a
    finite JSON number, a bool field ``true``/``false``. A JSON ``null`` is the default.
    The core :class:`~mi_core.configread.ConfigFields` with the transformer's method names
    and message wording (``{src}: {key} = {value!r} ({type}): expected ...``).
    """

    def __init__(self, cfg: Any, src: str) -> None:
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{src}: expected a JSON object, got {type(cfg).__name__}")
        bad = [k for k in cfg if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"{src}: keys must be strings, got {bad[:5]}")
        super().__init__(cfg, src, error=ConfigError)
        self.src = src

    def bad(self, key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{self.src}: {key} = {value!r} ({type(value).__name__}): "
                           f"expected {expected}")

    def type_error(self, key: str, value: Any, expected: str) -> ConfigError:
        return self.bad(key, value, "a finite number" if expected == "a number" else expected)

    def min_error(self, key: str, value: Any, minimum: Any) -> ConfigError:
        return self.bad(key, value, f"an integer >= {minimum}")

    def number_error(self, key: str, value: Any, broken: Any, bounds: Any) -> ConfigError:
        if broken is None:
            return self.bad(key, value, "a finite number")
        return self.bad(key, value, f"a number {broken[0]} {broken[1]}")

    def choice_error(self, key: str, value: Any, choices: Iterable[str]) -> ConfigError:
        return self.bad(key, value, f"one of {sorted(choices)}")

    def int(self, key: str, default: Any = _REQUIRED, *, min: int | None = 1) -> Any:
        return self.integer(key, default, min)

    def float(self, key: str, default: Any = _REQUIRED, *, gt: float | None = None,
              ge: float | None = None, le: float | None = None) -> Any:
        return self.number(key, default, gt=gt, ge=ge, le=le)

    def bool(self, key: str, default: Any = _REQUIRED) -> Any:
        return self.flag(key, default)

    def str(self, key: str, default: Any = _REQUIRED, choices: Iterable[str] | None = None
            ) -> Any:
        return self.text(key, default, choices)

    def list(self, key: str) -> Any:
        return self.sequence(key)

    def refuse_unless(self, key: str, allowed: Any, why: str) -> None:
        """A key whose other values change the numbers in a way not implemented."""
        v = self.get(key)
        if v is not None and v != allowed:
            raise ConfigError(f"{self.src}: {key} = {v!r} is not supported ({why}); only "
                              f"{allowed!r} is")

    def sub(self, key: str, value: Mapping[str, Any]) -> "ConfigReader":
        return ConfigReader(value, f"{self.src} [{key}]")


# ----------------------------------------------------------------------------------------
# Parsing helpers shared by the family parsers
# ----------------------------------------------------------------------------------------

_ACTIVATIONS = {
    "silu": Activation.SILU, "swish": Activation.SILU,
    "gelu_pytorch_tanh": Activation.GELU_TANH, "gelu_new": Activation.GELU_TANH,
    "gelu_fast": Activation.GELU_TANH,
    "gelu": Activation.GELU,
    "relu": Activation.RELU,
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


def _rope(r: ConfigReader, key: str, theta: float | None, max_pos: int | None,
          top_original: int | None = None) -> RopeConfig:
    """One RoPE from a `rope_parameters`-style or `rope_scaling`-style dict plus a base.

    `top_original`: a top-level ``original_max_position_embeddings`` (Phi-3), which
    transformers prefers over the dict's for llama3 / yarn / longrope."""
    params = r.mapping(key) if key in r.cfg else None
    p = r.sub(key, params or {})
    legacy = p.str("type", None)  # transformers 5 keeps the old spelling beside rope_type
    kind = p.str("rope_type", None) or legacy or "default"
    if kind not in _ROPE_KEYS:
        raise ConfigError(f"{p.src}: unsupported RoPE scaling type {kind!r} (supported: "
                          f"{', '.join(_ROPE_KEYS)})")
    theta = p.float("rope_theta", theta if theta is not None else 10000.0, gt=0)
    p.float("partial_rotary_factor", None, gt=0, le=1)  # read by the caller
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
        if not high > low:
            raise ConfigError(f"{p.src}: high_freq_factor {high} must exceed low_freq_factor {low}")
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
                          beta_fast=p.float("beta_fast", 32.0), beta_slow=p.float("beta_slow", 1.0),
                          mscale=p.float("mscale", None), mscale_all_dim=p.float("mscale_all_dim", None),
                          **common)
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
                   theta_key: str = "rope_theta") -> dict[str, RopeConfig]:
    """{"full_attention": RopeConfig, "sliding_attention": RopeConfig} from either format."""
    max_pos = r.int("max_position_embeddings", None)
    theta = r.float(theta_key, None, gt=0)
    params = r.mapping("rope_parameters")
    if params and any(k in params for k in _LAYER_TYPE_KEYS):  # transformers 5, nested
        sub = r.sub("rope_parameters", params)
        extra = sorted(set(params) - set(_LAYER_TYPE_KEYS))
        if extra:
            raise ConfigError(f"{sub.src}: keys {extra} are not understood")
        out = {k: _rope(sub, k, theta, max_pos) for k in _LAYER_TYPE_KEYS
               if sub.mapping(k) is not None}
        out.setdefault("full_attention", out.get("sliding_attention", RopeConfig()))
        out.setdefault("sliding_attention", out["full_attention"])
        return out
    top_original = r.int("original_max_position_embeddings", None)
    if params:  # transformers 5, flat
        glob = _rope(r, "rope_parameters", theta, max_pos, top_original)
    else:  # hub format: rope_theta + rope_scaling
        glob = _rope(r, "rope_scaling", theta, max_pos, top_original)
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
    return dict(
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


def _all_sliding(r: ConfigReader, base: dict[str, Any]) -> TransformerConfig:
    """Families where a non-null `sliding_window` applies to every layer."""
    window = r.int("sliding_window", None)
    types = ["sliding_attention" if window else "full_attention"] * base["num_layers"]
    return _finish(r, base, types, _ropes_by_type(r), window)


def _full(r: ConfigReader, base: dict[str, Any]) -> TransformerConfig:
    types = ["full_attention"] * base["num_layers"]
    return _finish(r, base, types, _ropes_by_type(r), None)


# ----------------------------------------------------------------------------------------
# One parser per family
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
                rope_layout=RopeLayout.INTERLEAVED)
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
    base = _base(r, "phi3")
    base.update(qkv_layout=QkvLayout.FUSED, mlp_layout=MlpLayout.GATED_FUSED,
                weight_names="phi3")
    # only longrope scaling reads it (refused by the rope parser until implemented)
    r.int("original_max_position_embeddings", None)
    # Phi-3's config.json says attention_bias: false; transformers' Phi-3 has no biases
    r.refuse_unless("attention_bias", False, "Phi-3's projections have no biases")
    return _all_sliding(r, base)


def parse_starcoder2(r: ConfigReader) -> TransformerConfig:
    base = _base(r, "starcoder2", eps_key="norm_epsilon", eps_default=1e-5,
                 act_default="gelu_pytorch_tanh", tie_default=True)
    bias = r.bool("use_bias", True)
    base.update(norm_type=NormType.LAYER_NORM, norm_bias=True, mlp_layout=MlpLayout.PLAIN,
                qkv_bias=bias, o_bias=bias, mlp_bias=bias, weight_names="starcoder2")
    return _all_sliding(r, base)


# ----------------------------------------------------------------------------------------
# GPT-style dense families: learned or partial rotary positions, fused QKV, parallel blocks
# ----------------------------------------------------------------------------------------

def _one_of(r: ConfigReader, keys: tuple[str, ...], default: float, **bounds: float) -> float:
    """A float that families spell several ways (e.g. `rotary_pct` / `partial_rotary_factor`,
    top level or inside `rope_parameters`); spellings present must agree."""
    params = r.mapping("rope_parameters") or {}
    sub = r.sub("rope_parameters", params)
    found = {k: r.float(k, None, **bounds) for k in keys}
    for k in keys:
        if k in params:
            found[f"rope_parameters.{k}"] = sub.float(k, None, **bounds)
    given = {k: v for k, v in found.items() if v is not None}
    if len(set(given.values())) > 1:
        raise ConfigError(f"{r.src}: {', '.join(given)} disagree: {given}")
    return next(iter(given.values()), default)


def _rotary_dims(r: ConfigReader, head_dim: int, frac: float) -> int:
    dims = int(head_dim * frac)  # transformers truncates
    if dims < 2 or dims % 2:
        raise ConfigError(f"{r.src}: partial rotary factor {frac} of head_dim {head_dim} gives "
                          f"{dims} rotated dims (must be even and >= 2)")
    return 0 if dims == head_dim else dims


def _gpt_rope(r: ConfigReader, base: dict[str, Any], frac_keys: tuple[str, ...],
              frac_default: float, theta_keys: tuple[str, ...] = ("rope_theta",)
              ) -> TransformerConfig:
    """Partial rotary (NeoX layout unless `base` says otherwise) over every layer."""
    frac = _one_of(r, ("partial_rotary_factor", *frac_keys), frac_default, gt=0, le=1)
    theta = _one_of(r, theta_keys, 10000.0, gt=0)
    base = dict(base, rotary_dim=_rotary_dims(r, base["head_dim"], frac))
    max_pos = r.int("max_position_embeddings", None)
    params = r.mapping("rope_parameters")
    rope = _rope(r, "rope_parameters" if params else "rope_scaling", theta, max_pos)
    n = base["num_layers"]
    return TransformerConfig(ropes=(rope,), layer_rope=(0,) * n, layer_windows=(None,) * n,
                             max_positions=max_pos, **base)


def _learned(base: dict[str, Any], max_positions: int, offset: int = 0) -> TransformerConfig:
    n = base["num_layers"]
    return TransformerConfig(positions=Positions.LEARNED, position_offset=offset,
                             max_positions=max_positions, layer_rope=(0,) * n,
                             layer_windows=(None,) * n, **base)


def _dense(r: ConfigReader, model_type: str, *, hidden: str, heads: str, layers: str,
           inner: str, inner_default: int | None, eps: str | None, act: str, act_default: str,
           tie_default: bool, kv: str | None = None) -> dict[str, Any]:
    """Sizes under a family's own key names (GPT-2's n_embd ...), LayerNorm with bias.
    `eps` None: the family's LayerNorms use torch's default 1e-5 whatever the config says."""
    d = r.int(hidden)
    h, k, hd = _heads(r, d, heads, kv, None)
    return dict(model_type=model_type, vocab_size=r.int("vocab_size"), hidden_size=d,
                num_layers=r.int(layers), num_heads=h, num_kv_heads=k, head_dim=hd,
                intermediate_size=r.int(inner, 4 * d if inner_default is None else inner_default),
                norm_type=NormType.LAYER_NORM, norm_bias=True,
                norm_eps=r.float(eps, 1e-5, gt=0) if eps else 1e-5,
                activation=_activation(r, act, act_default),
                tie_word_embeddings=r.bool("tie_word_embeddings", tie_default))


def parse_gpt2(r: ConfigReader) -> TransformerConfig:
    base = _dense(r, "gpt2", hidden="n_embd", heads="n_head", layers="n_layer", inner="n_inner",
                  inner_default=None, eps="layer_norm_epsilon", act="activation_function",
                  act_default="gelu_new", tie_default=True)
    r.bool("reorder_and_upcast_attn", False)  # float32 scores: the same numbers in F32
    base.update(weight_names="gpt2", qkv_layout=QkvLayout.CONV1D, mlp_layout=MlpLayout.PLAIN,
                qkv_bias=True, o_bias=True, mlp_bias=True,
                attn_scaled=r.bool("scale_attn_weights", True),
                attn_scale_by_layer=r.bool("scale_attn_by_inverse_layer_idx", False))
    n_pos = r.int("n_positions")
    n_ctx = r.int("n_ctx", None)
    if n_ctx is not None and n_ctx > n_pos:
        raise ConfigError(f"{r.src}: n_ctx = {n_ctx} exceeds n_positions = {n_pos}")
    return _learned(base, n_pos)


def parse_gpt_neox(r: ConfigReader) -> TransformerConfig:
    base = _dense(r, "gpt_neox", hidden="hidden_size", heads="num_attention_heads",
                  layers="num_hidden_layers", inner="intermediate_size", inner_default=None,
                  eps="layer_norm_eps", act="hidden_act", act_default="gelu", tie_default=False)
    bias = r.bool("attention_bias", True)
    parallel = r.bool("use_parallel_residual", True)
    base.update(weight_names="gpt_neox", qkv_layout=QkvLayout.HEAD_INTERLEAVED,
                mlp_layout=MlpLayout.PLAIN, qkv_bias=bias, o_bias=bias, mlp_bias=True,
                block=BlockLayout.PARALLEL if parallel else BlockLayout.SEQUENTIAL)
    return _gpt_rope(r, base, ("rotary_pct",), 0.25, ("rope_theta", "rotary_emb_base"))


def parse_gptj(r: ConfigReader) -> TransformerConfig:
    base = _dense(r, "gptj", hidden="n_embd", heads="n_head", layers="n_layer", inner="n_inner",
                  inner_default=None, eps="layer_norm_epsilon", act="activation_function",
                  act_default="gelu_new", tie_default=False)
    rot = r.int("rotary_dim")  # transformers' GPT-J cannot run without it
    # keys of the original GPT-J configs that transformers' GPT-J does not read: only their
    # values matching what it does are accepted
    r.refuse_unless("rotary", True, "GPT-J always uses rotary positions")
    r.refuse_unless("scale_attn_weights", True, "GPT-J always scales the scores")
    if rot > base["head_dim"] or rot % 2:
        raise r.bad("rotary_dim", rot, f"an even number <= head dim {base['head_dim']}")
    base.update(weight_names="gptj", mlp_layout=MlpLayout.PLAIN, mlp_bias=True,
                lm_head_bias=True, block=BlockLayout.PARALLEL_SHARED_NORM,
                rope_layout=RopeLayout.INTERLEAVED,
                rotary_dim=0 if rot == base["head_dim"] else rot)
    n = base["num_layers"]
    return TransformerConfig(layer_rope=(0,) * n, layer_windows=(None,) * n,
                             max_positions=r.int("n_positions"), **base)


def parse_phi(r: ConfigReader) -> TransformerConfig:
    base = _dense(r, "phi", hidden="hidden_size", heads="num_attention_heads",
                  kv="num_key_value_heads", layers="num_hidden_layers", inner="intermediate_size",
                  inner_default=None, eps="layer_norm_eps", act="hidden_act",
                  act_default="gelu_new", tie_default=False)
    r.refuse_unless("qk_layernorm", False, "per-head LayerNorm of q and k is not implemented")
    base.update(weight_names="phi", mlp_layout=MlpLayout.PLAIN, qkv_bias=True, o_bias=True,
                mlp_bias=True, lm_head_bias=True, block=BlockLayout.PARALLEL_SHARED_NORM)
    return _gpt_rope(r, base, (), 0.5)


def parse_stablelm(r: ConfigReader) -> TransformerConfig:
    base = _dense(r, "stablelm", hidden="hidden_size", heads="num_attention_heads",
                  kv="num_key_value_heads", layers="num_hidden_layers",
                  inner="intermediate_size", inner_default=None, eps="layer_norm_eps",
                  act="hidden_act", act_default="silu", tie_default=False)
    qk = r.bool("qk_layernorm", False)  # per-head LayerNorms (no bias) of q and k
    parallel = r.bool("use_parallel_residual", False)
    base.update(weight_names="stablelm" if qk else "llama", qk_norm=qk, qk_norm_heads=qk,
                qkv_bias=r.bool("use_qkv_bias", False),
                block=BlockLayout.PARALLEL_SHARED_NORM if parallel else BlockLayout.SEQUENTIAL)
    return _gpt_rope(r, base, (), 0.25)


def parse_opt(r: ConfigReader) -> TransformerConfig:
    base = _dense(r, "opt", hidden="hidden_size", heads="num_attention_heads",
                  layers="num_hidden_layers", inner="ffn_dim", inner_default=None,
                  eps=None, act="activation_function", act_default="relu",
                  tie_default=True)
    r.refuse_unless("do_layer_norm_before", True, "post-norm OPT (350m) is not implemented")
    r.refuse_unless("_remove_final_layer_norm", False, "the final norm is always applied")
    r.refuse_unless("layer_norm_elementwise_affine", True, "norms without weights")
    r.refuse_unless("word_embed_proj_dim", base["hidden_size"],
                    "embedding projections (project_in/out) are not implemented")
    bias = r.bool("enable_bias", True)
    base.update(weight_names="opt", mlp_layout=MlpLayout.PLAIN, qkv_bias=bias, o_bias=bias,
                mlp_bias=bias)
    return _learned(base, r.int("max_position_embeddings"), offset=2)


def parse_falcon(r: ConfigReader) -> TransformerConfig:
    """Falcon: the 7B-style multi-query parallel block (one shared norm, [q | k | v] rows),
    the new decoder architecture (grouped KV heads, ln_attn + ln_mlp), or sequential."""
    d = r.int("hidden_size")
    h, _, hd = _heads(r, d, "num_attention_heads", None, None)
    r.refuse_unless("alibi", False, "ALiBi position biases are not implemented")
    r.refuse_unless("apply_residual_connection_post_layernorm", False,
                    "transformers' Falcon ignores it; the original code adds the normed input")
    new = r.bool("new_decoder_architecture", False)
    mq = r.bool("multi_query", True)
    parallel = r.bool("parallel_attn", True)
    n_ln = r.int("num_ln_in_parallel_attn", None)
    kv = r.int("num_kv_heads", h)
    bias = r.bool("bias", False)
    if new:
        if h % kv:
            raise ConfigError(f"{r.src}: num_attention_heads = {h} is not a multiple of "
                              f"num_kv_heads = {kv}")
        if not parallel:
            raise ConfigError(f"{r.src}: new_decoder_architecture with parallel_attn = false "
                              f"is not a block transformers can run")
        n_ln = 2 if n_ln is None else n_ln
        layout = QkvLayout.GROUPED
    else:
        if n_ln not in (None, 1):
            raise r.bad("num_ln_in_parallel_attn", n_ln, "null or 1 without the new decoder "
                        "architecture")
        n_ln, kv = 1, 1 if mq else h
        layout = QkvLayout.FUSED if mq else QkvLayout.HEAD_INTERLEAVED
    if n_ln not in (1, 2):
        raise r.bad("num_ln_in_parallel_attn", n_ln, "1 or 2")
    block = (BlockLayout.SEQUENTIAL if not parallel else
             BlockLayout.PARALLEL if n_ln == 2 else BlockLayout.PARALLEL_SHARED_NORM)
    base = dict(model_type="falcon", vocab_size=r.int("vocab_size"), hidden_size=d,
                num_layers=r.int("num_hidden_layers"), num_heads=h, num_kv_heads=kv,
                head_dim=hd, intermediate_size=r.int("ffn_hidden_size", 4 * d),
                norm_type=NormType.LAYER_NORM, norm_bias=True,
                norm_eps=r.float("layer_norm_epsilon", 1e-5, gt=0),
                activation=_activation(r, "activation", "gelu"),
                tie_word_embeddings=r.bool("tie_word_embeddings", True),
                weight_names="falcon_two_norms" if block is BlockLayout.PARALLEL else "falcon",
                qkv_layout=layout, mlp_layout=MlpLayout.PLAIN, qkv_bias=bias, o_bias=bias,
                mlp_bias=bias, block=block)
    return _gpt_rope(r, base, (), 1.0)


_GPT2_HARMLESS = {"n_special", "predict_special_tokens",  # GPT-1 leftovers, never read
                  "summary_type", "summary_use_proj", "summary_activation",
                  "summary_proj_to_labels", "summary_first_dropout"}


# ----------------------------------------------------------------------------------------
# Mixture-of-experts families (the MLP is mi_transformer.moe)
# ----------------------------------------------------------------------------------------

def _moe(r: ConfigReader, experts_keys: tuple[str, ...], size_key: str,
         norm_default: bool | None, shared: bool = False, **names: Any) -> MoeConfig:
    """The MoE axes. experts_keys: spellings of the expert count (Qwen3-MoE configs on the hub
    say ``num_experts``, transformers 5 writes ``num_local_experts``); they must agree when
    both are present. norm_default: the family's ``norm_topk_prob`` default, or None when the
    family always renormalises and has no such key (Mixtral)."""
    counts = {k: r.int(k, None) for k in experts_keys}
    given = {k: v for k, v in counts.items() if v is not None}
    if not given:
        raise ConfigError(f"{r.src}: required field {experts_keys[0]!r} is missing")
    if len(set(given.values())) > 1:
        raise ConfigError(f"{r.src}: expert counts disagree: {given}")
    norm = True if norm_default is None else r.bool("norm_topk_prob", norm_default)
    shared_size = r.int("shared_expert_intermediate_size") if shared else 0
    return MoeConfig(num_experts=next(iter(given.values())), top_k=r.int("num_experts_per_tok"),
                     expert_size=r.int(size_key), norm_topk_prob=norm,
                     shared_expert_size=shared_size, shared_expert_gate=shared, **names)


def _sparse_layers(r: ConfigReader, n: int) -> tuple[bool, ...]:
    """Qwen-MoE: layer i is sparse unless listed in mlp_only_layers or (i + 1) is not a
    multiple of decoder_sparse_step."""
    step = r.int("decoder_sparse_step", 1)
    only = r.list("mlp_only_layers") or []
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in only):
        raise r.bad("mlp_only_layers", only, f"a list of layer indices in 0..{n - 1}")
    return tuple(i not in only and (i + 1) % step == 0 for i in range(n))


def parse_mixtral(r: ConfigReader) -> TransformerConfig:
    base = _base(r, "mixtral")
    moe = _moe(r, ("num_local_experts",), "intermediate_size", None, block="block_sparse_moe",
               expert_names=("w1", "w3", "w2"))
    base.update(moe=moe, layer_moe=(True,) * base["num_layers"])
    window = r.int("sliding_window", None)
    types = ["sliding_attention" if window else "full_attention"] * base["num_layers"]
    return _finish(r, base, types, _default_theta(r, _ropes_by_type(r), 1_000_000.0), window)


def parse_qwen2_moe(r: ConfigReader) -> TransformerConfig:
    base = _base(r, "qwen2_moe")
    base.update(qkv_bias=r.bool("qkv_bias", True),
                moe=_moe(r, ("num_experts", "num_local_experts"), "moe_intermediate_size",
                         False, shared=True),
                layer_moe=_sparse_layers(r, base["num_layers"]))
    return _qwen(r, base)


def parse_qwen3_moe(r: ConfigReader) -> TransformerConfig:
    base = _base(r, "qwen3_moe")
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, qk_norm=True,
                moe=_moe(r, ("num_experts", "num_local_experts"), "moe_intermediate_size", False),
                layer_moe=_sparse_layers(r, base["num_layers"]))
    return _qwen(r, base)


def parse_olmoe(r: ConfigReader) -> TransformerConfig:
    base = _base(r, "olmoe", eps_default=1e-5)
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_full=True,
                clip_qkv=r.float("clip_qkv", None, gt=0),
                moe=_moe(r, ("num_experts", "num_local_experts"), "intermediate_size", False),
                layer_moe=(True,) * base["num_layers"])
    return _full(r, base)


# ----------------------------------------------------------------------------------------
# LLaMA-like families with twists: OLMo, OLMo2, Granite, SmolLM3
# ----------------------------------------------------------------------------------------

def _default_theta(r: ConfigReader, ropes: dict[str, RopeConfig], theta: float
                   ) -> dict[str, RopeConfig]:
    """A family whose transformers config defaults rope_theta to something other than 1e4."""
    if not r.has("rope_parameters") and not r.has("rope_theta"):
        return {k: attrs.evolve(v, theta=theta) for k, v in ropes.items()}
    return ropes


def parse_olmo(r: ConfigReader) -> TransformerConfig:
    """OLMo: LayerNorm without weights or bias (eps fixed at 1e-5), optional clip_qkv."""
    base = _base(r, "olmo")
    bias = r.bool("attention_bias", False)
    base.update(norm_type=NormType.LAYER_NORM, norm_affine=False, norm_eps=1e-5,
                qkv_bias=bias, o_bias=bias, clip_qkv=r.float("clip_qkv", None, gt=0))
    return _full(r, base)


def parse_olmo2(r: ConfigReader) -> TransformerConfig:
    """OLMo2: RMS norms after attention and MLP only (no pre-norms), q/k RMS norms over the
    full projection width."""
    base = _base(r, "olmo2", eps_default=1e-5)
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_full=True, pre_norms=False,
                post_norms=True, weight_names="olmo2")
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
    unknown = sub.unread(FAMILIES["gemma3_text"].harmless)
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


_MOE_HARMLESS = {"output_router_logits", "router_aux_loss_coef", "router_jitter_noise"}
_QWEN_WINDOWS = {"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"}


# ----------------------------------------------------------------------------------------
# The registry: a family is a parser plus the keys it reads and the ones it may ignore
# ----------------------------------------------------------------------------------------

@attrs.frozen
class Family:
    """One supported ``model_type``.

    `reads`: every config key the parser looks at (implemented, or refused for values it
    cannot honour). `harmless`: family keys known not to change the numbers. Any other
    non-null key (beyond :data:`mi_core.configread.GENERIC_HARMLESS`) makes the config a ``ConfigError``.
    """

    model_type: str
    parse: Callable[[ConfigReader], TransformerConfig]
    reads: frozenset[str]
    harmless: frozenset[str] = frozenset()
    note: str = ""


_SHAPE_KEYS = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size",
               "max_position_embeddings", "hidden_act", "tie_word_embeddings"}
_ROPE = {"rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
         "original_max_position_embeddings"}  # the last: yarn / longrope at the top level
_LLAMA = _SHAPE_KEYS | _ROPE | {"rms_norm_eps", "attention_bias", "mlp_bias",
                                "use_bidirectional_attention"}


def _family(model_type: str, parse: Callable[[ConfigReader], TransformerConfig],
            reads: Iterable[str], harmless: Iterable[str] = (), note: str = "") -> Family:
    return Family(model_type, parse, frozenset(reads), frozenset(harmless), note)


#: model_type -> Family. A new family is one entry here plus a weight-name table
#: (mi_transformer.weights.NAME_TABLES); see docs/BACKENDS.md.
FAMILIES: dict[str, Family] = {f.model_type: f for f in [
    _family("llama", parse_llama, _LLAMA),
    _family("helium", parse_helium, _LLAMA, note="interleaved (GPT-J) rotary layout"),
    _family("mistral", parse_mistral, _LLAMA | {"sliding_window"}),
    _family("qwen2", parse_qwen2, _LLAMA | {"sliding_window", "use_sliding_window",
                                            "max_window_layers", "layer_types"}),
    _family("qwen3", parse_qwen3, _LLAMA | {"sliding_window", "use_sliding_window",
                                            "max_window_layers", "layer_types"}),
    _family("gemma", parse_gemma, _LLAMA | {"hidden_activation"}),
    _family("gemma2", parse_gemma2, _LLAMA | {
        "hidden_activation", "attn_logit_softcapping", "final_logit_softcapping",
        "query_pre_attn_scalar", "sliding_window", "sliding_window_size", "layer_types"},
        harmless={"cache_implementation"}),
    _family("gemma3_text", parse_gemma3_text, _LLAMA | {
        "hidden_activation", "attn_logit_softcapping", "final_logit_softcapping",
        "query_pre_attn_scalar", "sliding_window", "layer_types", "sliding_window_pattern",
        "_sliding_window_pattern", "rope_local_base_freq"},
        harmless={"cache_implementation"}),
    _family("phi3", parse_phi3, _LLAMA | {"sliding_window", "original_max_position_embeddings"}),
    _family("cohere", parse_cohere, _LLAMA | {"layer_norm_eps", "use_qk_norm", "logit_scale"},
            note="parallel block, one shared LayerNorm, interleaved rotary"),
    _family("gemma3", parse_gemma3, {"text_config", "tie_word_embeddings", *_GEMMA3_MM_KEYS},
            note="multimodal checkpoint: the language model only"),
    _family("olmo", parse_olmo, _LLAMA | {"clip_qkv"},
            note="non-parametric LayerNorm, clip_qkv"),
    _family("olmo2", parse_olmo2, _LLAMA, note="post-norms only, full-width q/k norms"),
    _family("granite", parse_granite, _LLAMA | {
        "embedding_multiplier", "residual_multiplier", "attention_multiplier",
        "logits_scaling"}),
    _family("smollm3", parse_smollm3, _LLAMA | {
        "no_rope_layers", "no_rope_layer_interval", "use_sliding_window", "sliding_window",
        "layer_types"}, note="NoPE layers"),
    _family("mixtral", parse_mixtral, _LLAMA | {"sliding_window", "num_local_experts",
                                                "num_experts_per_tok"}, harmless=_MOE_HARMLESS),
    _family("qwen2_moe", parse_qwen2_moe, _LLAMA | _QWEN_WINDOWS | {
        "qkv_bias", "num_experts", "num_local_experts", "num_experts_per_tok",
        "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob",
        "decoder_sparse_step", "mlp_only_layers"}, harmless=_MOE_HARMLESS),
    _family("qwen3_moe", parse_qwen3_moe, _LLAMA | _QWEN_WINDOWS | {
        "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
        "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"}, harmless=_MOE_HARMLESS),
    _family("olmoe", parse_olmoe, _LLAMA | {"num_experts", "num_local_experts",
                                            "num_experts_per_tok", "norm_topk_prob",
                                            "clip_qkv"}, harmless=_MOE_HARMLESS),
    _family("gpt2", parse_gpt2, {
        "vocab_size", "n_embd", "n_head", "n_layer", "n_inner", "n_positions", "n_ctx",
        "layer_norm_epsilon", "activation_function", "tie_word_embeddings",
        "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"},
        harmless=_GPT2_HARMLESS, note="learned positions, Conv1D fused QKV"),
    _family("gpt_neox", parse_gpt_neox, _SHAPE_KEYS | _ROPE | {
        "layer_norm_eps", "attention_bias", "use_parallel_residual", "rotary_pct",
        "rotary_emb_base"}, note="per-head fused QKV, partial rotary, parallel or sequential"),
    _family("gptj", parse_gptj, {"rotary", "scale_attn_weights",
        "vocab_size", "n_embd", "n_head", "n_layer", "n_inner", "n_positions", "rotary_dim",
        "layer_norm_epsilon", "activation_function", "tie_word_embeddings"},
        harmless=_GPT2_HARMLESS, note="parallel, one norm, interleaved partial rotary"),
    _family("phi", parse_phi, _SHAPE_KEYS | _ROPE | {"layer_norm_eps", "qk_layernorm"},
            note="parallel, one norm, partial rotary"),
    _family("stablelm", parse_stablelm, _SHAPE_KEYS | _ROPE | {
        "layer_norm_eps", "qk_layernorm", "use_parallel_residual", "use_qkv_bias"},
        note="LayerNorm, partial rotary, sequential or parallel (one norm)"),
    _family("opt", parse_opt, {
        "vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "ffn_dim",
        "max_position_embeddings", "activation_function",
        "tie_word_embeddings", "do_layer_norm_before", "_remove_final_layer_norm",
        "layer_norm_elementwise_affine", "word_embed_proj_dim", "enable_bias"},
        note="learned positions (offset 2), ReLU; LayerNorm eps fixed at 1e-5"),
    _family("falcon", parse_falcon, _ROPE | {"apply_residual_connection_post_layernorm",
        "vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "num_kv_heads",
        "ffn_hidden_size", "layer_norm_epsilon", "activation", "tie_word_embeddings", "alibi",
        "new_decoder_architecture", "multi_query", "parallel_attn", "num_ln_in_parallel_attn",
        "bias", "max_position_embeddings"},
        note="multi-query / grouped (new decoder) / per-head fused QKV"),
    _family("starcoder2", parse_starcoder2, _LLAMA | {"sliding_window", "norm_epsilon",
                                                      "use_bias"}),
]}


def family_parsers() -> dict[str, Callable[[ConfigReader], TransformerConfig]]:
    return {k: f.parse for k, f in FAMILIES.items()}


#: Backwards-compatible view: model_type -> parser.
FAMILY_PARSERS = family_parsers()


class UnknownKeysError(ConfigError):
    """A config holds keys that may change the numbers and that no parser implements."""

    def __init__(self, message: str, keys: list[str]) -> None:
        super().__init__(message)
        self.keys = keys


def _run(family: Family, cfg: Any, src: str, parse: Callable[[ConfigReader], TransformerConfig]
         | None = None) -> TransformerConfig:
    r = ConfigReader(cfg, src)
    try:
        out = (parse or family.parse)(r)
    except ConfigError as exc:
        if src in str(exc):
            raise
        # a relation TransformerConfig checks on its axes: say which file it came from
        raise ConfigError(f"{src}: {exc}") from None
    # auto_map names custom modeling code: for a family implemented here transformers (without
    # trust_remote_code) ignores it as well; an unknown model_type with one is refused
    unknown = r.unread(family.harmless | ({"auto_map"} if family is not AUTO_FAMILY else set()))
    if unknown:
        raise UnknownKeysError(
            f"{src}: {family.model_type} config has keys this backend does not read and does not "
            f"know to be harmless (they may change the numbers): {', '.join(unknown)}", unknown)
    return out


def parse_config(cfg: Mapping[str, Any], src: str = "config.json",
                 tensor_names: Iterable[str] | None = None) -> TransformerConfig:
    """The family's parser for a known `model_type`, else :func:`auto_config`."""
    r = ConfigReader(cfg, src)
    mt = r.str("model_type")
    family = FAMILIES.get(mt)
    if family is not None:
        return _run(family, cfg, src)
    return auto_config(cfg, src, list(tensor_names or []))


#: What auto-config understands: LLaMA's keys plus a uniform sliding window.
AUTO_FAMILY = _family("<auto>", parse_llama, _LLAMA | {"sliding_window"},
                      note="unknown model_type with LLaMA-like keys and tensors")


def auto_config(cfg: Mapping[str, Any], src: str, tensor_names: Iterable[str]
                ) -> TransformerConfig:
    """A LLaMA-like config for an unknown `model_type`, layouts read off the tensor names.

    Accepted only when every key is one LLaMA reads or a generic harmless one (an
    :class:`UnknownKeysError` names the rest: Granite's multipliers, SmolLM3's NoPE layers).
    RMS norm, RoPE, gated MLP; fused/separate QKV and gate/up, biases and q/k norms are
    taken from which tensors exist. Whether the tensors then match is checked by
    :func:`mi_transformer.weights.check_tensors` (detection lists missing/unexpected).
    """
    names = set(tensor_names)
    has = lambda suffix: f"model.layers.0.{suffix}" in names  # noqa: E731

    def parse(r: ConfigReader) -> TransformerConfig:
        base = _base(r, r.str("model_type"),
                     tie_default="lm_head.weight" not in names)
        fused = has("self_attn.qkv_proj.weight")
        base.update(
            qkv_layout=QkvLayout.FUSED if fused else QkvLayout.SEPARATE,
            mlp_layout=MlpLayout.GATED_FUSED if has("mlp.gate_up_proj.weight") else MlpLayout.GATED,
            weight_names="phi3" if fused else "llama",
            qkv_bias=has("self_attn.q_proj.bias") or has("self_attn.qkv_proj.bias"),
            o_bias=has("self_attn.o_proj.bias"),
            mlp_bias=has("mlp.down_proj.bias"),
            qk_norm=has("self_attn.q_norm.weight"),
        )
        r.bool("attention_bias", False)
        r.bool("mlp_bias", False)
        return _all_sliding(r, base)

    return _run(AUTO_FAMILY, cfg, src, parse)
