"""Parsers of Gemma-4 (``gemma4_text``; ``gemma4``, whose language model is loaded text-only,
dense and MoE) and Gemma-3n (``gemma3n_text``; ``gemma3n``), as transformers'
``Gemma4TextConfig`` / ``Gemma3nTextConfig`` resolve them.

What these families add to the generic forward (each a typed axis of
:class:`~mi_transformer.config.axes.TransformerConfig`, read with defaults that leave every
other family unchanged):

- per-layer input embeddings (``per_layer_input``): ``hidden_size_per_layer_input`` wide
  per layer, from ``embed_tokens_per_layer`` and a projection of the token embedding;
- keys and values shared across layers (``layer_kv_source``): the last
  ``num_kv_shared_layers`` layers attend with the keys / values of the last earlier layer of
  their type (sliding or full) and have no k / v projections of their own;
- values RMS-normed without a gain (``v_norm``), q / k RMS norms with gains, attention
  scale 1;
- Gemma-4: a head size and KV-head count per layer type (``layer_head_dim``,
  ``layer_kv_heads``: ``global_head_dim`` / ``num_global_key_value_heads``, or the
  ``per_layer_config`` transformers writes), keys used as values on the full layers
  (``attention_k_eq_v``: ``layer_k_eq_v``), proportional RoPE on the full layers, a
  double-wide MLP on the KV-shared layers (``layer_mlp_size``), a scalar per layer
  (``layer_scalar``), a mixture of experts beside the dense MLP (``enable_moe_block``);
- Gemma-3n: AltUp's several residual streams (``altup``), Laurel's low-rank residual block
  (``laurel_rank``), Gaussian top-k activation sparsity (``layer_sparsity``), an MLP width
  per layer (``intermediate_size`` as a list).

Keys the published configs carry that transformers never reads are accepted at their neutral
value or, where any value leaves the numbers alone (training settings), as harmless; the
multimodal wrappers' vision / audio sub-configs and token ids are ignored (only the language
model is loaded, as for ``gemma3``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs

from mi_core.plugin import ConfigError

from mi_transformer.config.axes import (AltUpConfig, MoeConfig, NormType, PerLayerInputConfig,
                                        RopeConfig, RopeScaling, TransformerConfig)
from mi_transformer.config.common import _LAYER_TYPE_KEYS, _activation, _heads, _ropes_by_type
from mi_transformer.config.neutral import ROTARY, policy_violations
from mi_transformer.config.reader import ConfigReader, UnknownKeysError
from mi_transformer.config.size import check_parsed


def _with_defaults(r: ConfigReader, defaults: dict[str, Any]) -> None:
    """transformers' class defaults for keys absent (or null) in the file."""
    merged = dict(r.cfg)
    for k, v in defaults.items():
        if merged.get(k) is None:
            merged[k] = v
    r.cfg = merged


def _sizes(r: ConfigReader, model_type: str) -> dict[str, Any]:
    """The LLaMA-style sizes and the Gemma settings both families share (RMS norms x * w, the
    gain in float32, gelu-tanh, the embedding times sqrt(d_model), attention scale 1, q / k / v
    norms)."""
    hidden = r.int("hidden_size")
    heads, kv, head_dim = _heads(r, hidden, "num_attention_heads", "num_key_value_heads")
    inter = r.get("intermediate_size")
    base = dict(
        model_type=model_type, vocab_size=r.int("vocab_size"), hidden_size=hidden,
        num_layers=r.int("num_hidden_layers"), num_heads=heads, num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=r.int("intermediate_size") if not isinstance(inter, list) else 1,
        norm_type=NormType.RMS, norm_eps=r.float("rms_norm_eps", gt=0),
        norm_gain_float32=True,  # transformers' (norm(x.float()) * w.float()).type_as(x)
        activation=_activation(r, "hidden_activation", "gelu_pytorch_tanh"),
        tie_word_embeddings=r.bool("tie_word_embeddings"),
        max_positions=r.int("max_position_embeddings", None),
        embedding_scale=math.sqrt(hidden), post_norms=True, qk_norm=True, v_norm=True,
        attn_multiplier=1.0, weight_names="gemma2",
        final_softcap=r.float("final_logit_softcapping", None, gt=0))
    bias = r.bool("attention_bias", False)
    base.update(qkv_bias=bias, o_bias=bias)
    check_parsed(r, base, ("vocab_size", "hidden_size", "num_hidden_layers",
                           "num_attention_heads", "num_key_value_heads", "head_dim",
                           "intermediate_size"))
    return base


def _types(r: ConfigReader, n: int, default: Callable[[int], bool]) -> list[str]:
    """``layer_types`` (or the class default pattern, sliding where `default(i)`)."""
    types = r.list("layer_types")
    if types is None:
        types = ["sliding_attention" if default(i) else "full_attention" for i in range(n)]
    if len(types) != n or not all(t in _LAYER_TYPE_KEYS for t in types):
        raise r.bad("layer_types", types, f"{n} entries of 'sliding_attention' / "
                                          f"'full_attention'")
    return list(types)


def _kv_sources(r: ConfigReader, types: list[str]) -> tuple[int, ...]:
    """transformers' ``kv_sharing_modes``: the last ``num_kv_shared_layers`` layers reuse the
    keys / values of the last earlier layer of their type."""
    n = len(types)
    shared = r.int("num_kv_shared_layers", min=0)
    if shared >= n and shared:
        raise r.bad("num_kv_shared_layers", shared, f"fewer than the {n} layers (a shared "
                                                    f"layer needs an earlier one to read)")
    first = n - shared
    sources = list(range(n))
    for i in range(first, n):
        own = [j for j in range(first) if types[j] == types[i]]
        if not own:
            raise ConfigError(f"{r.src}: layer {i} ({types[i]}) shares keys and values but no "
                              f"layer before the {shared} shared ones has that type")
        sources[i] = own[-1]
    return tuple(sources) if shared else ()


def _use_bidirectional(r: ConfigReader) -> None:
    """``use_bidirectional_attention``: null, false or "vision" (image tokens only, which a
    text-only forward never has) leave text causal; "all" / true are refused."""
    v = r.get("use_bidirectional_attention")
    if v not in (None, False, "vision"):
        raise r.bad("use_bidirectional_attention", v,
                    'null or "vision" (causal text; bidirectional attention is not supported)')


# ----------------------------------------------------------------------------------------
# Gemma-4
# ----------------------------------------------------------------------------------------

#: Gemma4TextConfig's defaults (a key absent or null in the file takes these)
_GEMMA4_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "sliding_window": 512, "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256, "attention_k_eq_v": False, "num_kv_shared_layers": 0,
    "enable_moe_block": False, "use_double_wide_mlp": False,
}
#: transformers' rope when the config gives none
_GEMMA4_ROPES = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                    "rope_theta": 1_000_000.0}}
#: the attributes transformers' Gemma-4 reads per layer from ``per_layer_config``
_PER_LAYER_KEYS = ("head_dim", "num_key_value_heads")


def _gemma4_rope(r: ConfigReader, kind: str, dim: int) -> RopeConfig:
    """One layer type's rope of Gemma-4's nested ``rope_parameters`` over heads `dim` wide:
    "default" (every dim rotated; transformers' Gemma-4 ignores a partial factor there, so
    only 1 is accepted) or "proportional" (``partial_rotary_factor`` of the frequencies,
    exponents over the whole head, ``factor`` dividing them)."""
    p = r.sub(kind, r.mapping(kind) or {})
    rope_type = p.str("rope_type", "default", choices=("default", "proportional"))
    theta = p.float("rope_theta", gt=0)
    if rope_type == "default":
        p.refuse_unless("partial_rotary_factor", 1.0, "transformers' Gemma-4 rotates every dim "
                                                      "of a default rope")
        extra = p.unread()
        if extra:
            raise ConfigError(f"{p.src}: keys {extra} are not understood for RoPE type "
                              f"'default'")
        return RopeConfig(theta=theta, dim=dim)
    fraction = p.float("partial_rotary_factor", 1.0, gt=0, le=1)
    factor = p.float("factor", 1.0, gt=0)
    extra = p.unread()
    if extra:
        raise ConfigError(f"{p.src}: keys {extra} are not understood for RoPE type "
                          f"'proportional'")
    return RopeConfig(theta=theta, scaling=RopeScaling.PROPORTIONAL, fraction=fraction,
                      factor=factor, dim=dim)


def _gemma4_geometry(r: ConfigReader, base: dict[str, Any], types: list[str], k_eq_v: bool
                     ) -> tuple[list[int], list[int]]:
    """(head size, KV heads) per layer: the full layers' from ``global_head_dim`` (512) and,
    with ``attention_k_eq_v``, ``num_global_key_value_heads`` (as transformers' config does),
    or from the ``per_layer_config`` transformers writes (the two must agree when both are
    given; transformers reads the latter)."""
    n = base["num_layers"]
    global_dim = r.int("global_head_dim", 512)
    global_kv = r.int("num_global_key_value_heads", None)
    overrides: dict[int, dict[str, Any]] = {
        i: {"head_dim": global_dim} | ({"num_key_value_heads": global_kv}
                                       if k_eq_v and global_kv is not None else {})
        for i, t in enumerate(types) if t == "full_attention"}
    plc = r.mapping("per_layer_config")
    if plc is not None:
        given = _per_layer_config(r, plc, n)
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        checks = [("global_head_dim", global_dim, "head_dim", base["head_dim"])]
        if k_eq_v and global_kv is not None:
            checks.append(("num_global_key_value_heads", global_kv, "num_key_value_heads",
                           base["num_kv_heads"]))
        for key, value, per_layer, default in checks:
            if r.has(key) and any(given.get(i, {}).get(per_layer, default) != value
                                  for i in full):
                raise ConfigError(f"{r.src}: {key} = {value} disagrees with per_layer_config "
                                  f"{plc!r} (transformers reads the latter)")
        overrides = given
    dims = [overrides.get(i, {}).get("head_dim", base["head_dim"]) for i in range(n)]
    kvs = [overrides.get(i, {}).get("num_key_value_heads", base["num_kv_heads"])
           for i in range(n)]
    for kind in _LAYER_TYPE_KEYS:  # one rope per layer type: one head size per type
        widths = {dims[i] for i, t in enumerate(types) if t == kind}
        if len(widths) > 1:
            raise ConfigError(f"{r.src}: the {kind} layers have head sizes {sorted(widths)}; "
                              f"transformers' Gemma-4 builds one rope per layer type")
    for i, kv in enumerate(kvs):
        if kv < 1 or base["num_heads"] % kv:
            raise ConfigError(f"{r.src}: layer {i}'s {kv} KV heads do not divide the "
                              f"{base['num_heads']} heads")
    return dims, kvs


def _per_layer_config(r: ConfigReader, plc: dict[str, Any], n: int
                      ) -> dict[int, dict[str, int]]:
    """``per_layer_config``: layer index (a string) -> the overrides Gemma-4 reads per layer
    (head_dim, num_key_value_heads); any other override is refused."""
    sub = r.sub("per_layer_config", plc)
    given: dict[int, dict[str, int]] = {}
    for key, value in plc.items():
        if not (key.isdigit() and int(key) < n) or not isinstance(value, dict):
            raise sub.bad(key, value, f"a layer index in 0..{n - 1} mapping to overrides")
        lay = sub.sub(key, value)
        extra = sorted(set(value) - set(_PER_LAYER_KEYS))
        if extra:
            raise ConfigError(f"{lay.src}: per-layer overrides {extra} are not supported "
                              f"(transformers' Gemma-4 reads {', '.join(_PER_LAYER_KEYS)})")
        given[int(key)] = {k: lay.int(k) for k in _PER_LAYER_KEYS if value.get(k) is not None}
    return given


def _finish_gemma(r: ConfigReader, base: dict[str, Any], types: list[str],
                  ropes: dict[str, RopeConfig], window: int | None) -> TransformerConfig:
    """The per-layer rope / window tuples (:func:`~mi_transformer.config.common._finish`
    without its refusal of ``use_bidirectional_attention``, which these families check
    themselves)."""
    order = list(dict.fromkeys(ropes[t] for t in _LAYER_TYPE_KEYS))
    return TransformerConfig(
        ropes=tuple(order), layer_rope=tuple(order.index(ropes[t]) for t in types),
        layer_windows=tuple(window if t == "sliding_attention" else None for t in types),
        **base)


def parse_gemma4_text(r: ConfigReader) -> TransformerConfig:
    """Gemma-4's language model (``Gemma4ForCausalLM``; the E2B / E4B, 26B-A4B MoE and 31B
    checkpoints' text_config)."""
    _with_defaults(r, _GEMMA4_DEFAULTS)
    base = _sizes(r, "gemma4_text")
    n = base["num_layers"]
    types = _types(r, n, lambda i: bool((i + 1) % 6))
    types[-1] = "full_attention"  # transformers forces the last layer to full attention
    _use_bidirectional(r)
    k_eq_v = r.bool("attention_k_eq_v")
    dims, kvs = _gemma4_geometry(r, base, types, k_eq_v)
    sources = _kv_sources(r, types)
    inter = base["intermediate_size"]
    wide = r.bool("use_double_wide_mlp")
    sizes = [2 * inter if wide and sources and sources[i] != i else inter for i in range(n)]
    ple = r.int("hidden_size_per_layer_input", min=0)
    ple_vocab = r.int("vocab_size_per_layer_input")
    check_parsed(r, dict(base, vocab_size=max(base["vocab_size"], ple_vocab)),
                 ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "intermediate_size"))
    base.update(
        layer_head_dim=tuple(dims) if len(set(dims)) > 1 else (),
        layer_kv_heads=tuple(kvs) if len(set(kvs)) > 1 else (),
        num_kv_heads=kvs[0] if len(set(kvs)) == 1 else base["num_kv_heads"],
        head_dim=dims[0] if len(set(dims)) == 1 else base["head_dim"],
        layer_kv_source=sources,
        layer_k_eq_v=tuple(k_eq_v and t == "full_attention" for t in types) if k_eq_v else (),
        layer_mlp_size=tuple(sizes) if len(set(sizes)) > 1 else (),
        intermediate_size=sizes[0] if len(set(sizes)) == 1 else inter,
        layer_scalar=True, weight_names="gemma4",
        per_layer_input=PerLayerInputConfig(dim=ple, vocab=ple_vocab) if ple else None)
    if r.bool("enable_moe_block"):
        base["moe"] = MoeConfig(
            num_experts=r.int("num_experts"), top_k=r.int("top_k_experts"),
            expert_size=r.int("moe_intermediate_size"), norm_topk_prob=True, block="",
            router_name="router.proj", fused_linear=True, beside_mlp=True,
            router_input_scale=True, accumulate_float32=True)
        base["layer_moe"] = (True,) * n
    else:  # read only with the block (transformers' class defaults them to null)
        r.read.update({"num_experts", "top_k_experts", "moe_intermediate_size"})
    params = r.mapping("rope_parameters")
    ropes_json = _GEMMA4_ROPES if params is None else params
    sub = r.sub("rope_parameters", ropes_json)
    extra = sorted(set(ropes_json) - set(_LAYER_TYPE_KEYS))
    if extra:
        raise ConfigError(f"{sub.src}: keys {extra} are not understood (one rope per layer "
                          f"type: {', '.join(_LAYER_TYPE_KEYS)})")
    ropes = {}
    for kind in _LAYER_TYPE_KEYS:
        width = next((dims[i] for i, t in enumerate(types) if t == kind), None)
        if width is None:
            continue
        if kind not in ropes_json:
            raise ConfigError(f"{sub.src}: no rope for the {kind} layers")
        ropes[kind] = _gemma4_rope(sub, kind, width)
    ropes.setdefault("full_attention", ropes.get("sliding_attention", RopeConfig()))
    ropes.setdefault("sliding_attention", ropes["full_attention"])
    return _finish_gemma(r, base, types, ropes, r.int("sliding_window"))


#: Keys of the Gemma-4 / Gemma-3n multimodal checkpoints that only matter with images, video
#: or audio (the towers and embedders are not loaded: a text-only forward)
_MM_KEYS = {"vision_config", "audio_config", "boi_token_id", "eoi_token_id", "image_token_id",
            "video_token_id", "boa_token_id", "eoa_token_index", "eoa_token_id",
            "audio_token_id", "audio_soft_tokens_per_image", "vision_soft_tokens_per_image",
            "initializer_range", "use_cache"}


def _multimodal(r: ConfigReader, inner: Callable[[ConfigReader], TransformerConfig],
                harmless: frozenset[str], neutral: dict[str, Any], model_type: str,
                weight_names: str) -> TransformerConfig:
    """A multimodal wrapper's language model, parsed from ``text_config`` as the text family
    (its keys checked with that family's policy); text-only forward."""
    tc = r.mapping("text_config")
    if tc is None:
        tc = {}  # transformers builds the text model from its class defaults
    r.read.add("text_config")
    sub = r.sub("text_config", tc)
    cfg = inner(sub)
    unknown = policy_violations(sub.cfg, sub.read, harmless, neutral, cfg, sub.src)
    if unknown:
        raise UnknownKeysError(f"{sub.src}: keys that change the numbers and are not "
                               f"implemented (or are unknown): {', '.join(unknown)}", unknown)
    r.read.update(_MM_KEYS)
    tie = r.bool("tie_word_embeddings", cfg.tie_word_embeddings)
    return attrs.evolve(cfg, model_type=model_type, weight_names=weight_names,
                        tie_word_embeddings=tie)


#: Gemma-4 text keys that do not change the numbers
GEMMA4_HARMLESS = frozenset({"cache_implementation"})
#: Gemma-4 text keys read by the parser (beyond the generic ones)
GEMMA4_READS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_activation",
    "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "rope_parameters",
    "attention_bias", "sliding_window", "layer_types", "final_logit_softcapping",
    "use_bidirectional_attention", "vocab_size_per_layer_input", "hidden_size_per_layer_input",
    "attention_k_eq_v", "num_kv_shared_layers", "enable_moe_block", "use_double_wide_mlp",
    "num_experts", "top_k_experts", "moe_intermediate_size", "global_head_dim",
    "num_global_key_value_heads", "per_layer_config"})


def parse_gemma4(r: ConfigReader) -> TransformerConfig:
    """Gemma-4 multimodal checkpoints (``model_type: gemma4``, e.g. gemma-4-E2B-it): the
    language model inside, parsed from ``text_config`` as ``gemma4_text``; the vision and
    audio towers are not loaded (text-only forward)."""
    return _multimodal(r, parse_gemma4_text, GEMMA4_HARMLESS, dict(ROTARY), "gemma4",
                       "gemma4_mm")


# ----------------------------------------------------------------------------------------
# Gemma-3n
# ----------------------------------------------------------------------------------------

#: Gemma3nTextConfig's defaults
_GEMMA3N_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_400, "hidden_size": 2048, "intermediate_size": 16_384,
    "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 32_768, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "sliding_window": 512, "final_logit_softcapping": 30.0,
    "vocab_size_per_layer_input": 262_144, "hidden_size_per_layer_input": 256,
    "altup_active_idx": 0, "altup_coef_clip": 120.0, "altup_correct_scale": True,
    "altup_num_inputs": 4, "num_kv_shared_layers": 15, "laurel_rank": 64,
}


def _gemma3n_sizes(r: ConfigReader, n: int) -> tuple[int, ...]:
    """``intermediate_size``: one integer for every layer, or one per layer."""
    v = r.get("intermediate_size")
    if isinstance(v, list):
        if len(v) != n or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                  for x in v):
            raise r.bad("intermediate_size", v, f"an integer >= 1 or a list of {n} of them")
        return tuple(v)
    return (r.int("intermediate_size"),) * n


def _sparsity(r: ConfigReader, n: int) -> tuple[float, ...]:
    """``activation_sparsity_pattern``: one value in [0, 1) per layer (default: 0.95 on the
    first 10 layers of a model with more than 10, else none)."""
    v = r.get("activation_sparsity_pattern")
    if v is None:
        k = 10 if n > 10 else 0
        return (0.95,) * k + (0.0,) * (n - k)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v]  # transformers' type allows one float, then requires one per layer
    if not isinstance(v, list) or len(v) != n or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1 for x in v):
        raise r.bad("activation_sparsity_pattern", v, f"{n} values in [0, 1), one per layer")
    return tuple(float(x) for x in v)


def _gemma3n_ropes(r: ConfigReader) -> dict[str, RopeConfig]:
    """transformers 5's nested ``rope_parameters``, or the hub's ``rope_theta`` (full layers,
    default 1e6), ``rope_local_base_freq`` (sliding layers, 1e4) and ``rope_scaling`` (full
    layers)."""
    if r.mapping("rope_parameters") is None and not r.has("rope_theta"):
        _with_defaults(r, {"rope_theta": 1_000_000.0})
    ropes = _ropes_by_type(r, local_theta_key="rope_local_base_freq")
    r.read.add("rope_local_base_freq")
    return ropes


def parse_gemma3n_text(r: ConfigReader) -> TransformerConfig:
    """Gemma-3n's language model (``Gemma3nForCausalLM``; the E2B / E4B checkpoints'
    text_config)."""
    _with_defaults(r, _GEMMA3N_DEFAULTS)
    base = _sizes(r, "gemma3n_text")
    n = base["num_layers"]
    if base["hidden_size"] % base["num_heads"]:  # transformers' validate_architecture
        raise ConfigError(f"{r.src}: hidden_size {base['hidden_size']} is not a multiple of "
                          f"num_attention_heads {base['num_heads']}")
    sizes = _gemma3n_sizes(r, n)
    types = _types(r, n, lambda i: bool((i + 1) % 5))
    active = r.int("altup_active_idx", min=0)
    altup = AltUpConfig(num_inputs=r.int("altup_num_inputs"), active=active,
                        correct_scale=r.bool("altup_correct_scale"),
                        coef_clip=r.float("altup_coef_clip", None, gt=0))
    ple = r.int("hidden_size_per_layer_input")
    base.update(
        layer_kv_source=_kv_sources(r, types),
        layer_mlp_size=sizes if len(set(sizes)) > 1 else (),
        intermediate_size=sizes[0], layer_sparsity=_sparsity(r, n),
        laurel_rank=r.int("laurel_rank"), altup=altup, weight_names="gemma3n",
        per_layer_input=PerLayerInputConfig(dim=ple, vocab=r.int("vocab_size_per_layer_input"),
                                            clip_ids=True))
    if not any(base["layer_sparsity"]):
        base["layer_sparsity"] = ()
    return _finish_gemma(r, base, types, _gemma3n_ropes(r), r.int("sliding_window"))


#: Gemma-3n text keys that do not change the numbers: a training setting, and the attention
#: scalar transformers' Gemma-3n never reads (its scale is 1: q is RMS-normed)
GEMMA3N_HARMLESS = frozenset({"altup_lr_multiplier", "query_pre_attn_scalar",
                              "cache_implementation"})
GEMMA3N_READS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_activation",
    "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "rope_parameters",
    "rope_theta", "rope_scaling", "rope_local_base_freq", "attention_bias", "sliding_window",
    "layer_types", "final_logit_softcapping", "vocab_size_per_layer_input",
    "hidden_size_per_layer_input", "altup_active_idx", "altup_coef_clip",
    "altup_correct_scale", "altup_num_inputs", "num_kv_shared_layers", "laurel_rank",
    "activation_sparsity_pattern"})


def parse_gemma3n(r: ConfigReader) -> TransformerConfig:
    """Gemma-3n multimodal checkpoints (``model_type: gemma3n``, e.g. gemma-3n-E4B-it): the
    language model inside, parsed from ``text_config`` as ``gemma3n_text``; the vision and
    audio towers are not loaded (text-only forward)."""
    return _multimodal(r, parse_gemma3n_text, GEMMA3N_HARMLESS, dict(ROTARY), "gemma3n",
                       "gemma3n_mm")


#: (model_type, parser, keys read, keys known harmless, note); the registry adds them
GEMMA_FAMILIES: list[tuple[str, Callable[[ConfigReader], TransformerConfig], frozenset[str],
                           frozenset[str], str]] = [
    ("gemma4_text", parse_gemma4_text, GEMMA4_READS, GEMMA4_HARMLESS,
     "per-layer inputs, shared KV, k = v, head size per layer type, MoE beside the MLP"),
    ("gemma4", parse_gemma4, frozenset({"text_config", "tie_word_embeddings", *_MM_KEYS}),
     frozenset(), "multimodal checkpoint: the language model only"),
    ("gemma3n_text", parse_gemma3n_text, GEMMA3N_READS, GEMMA3N_HARMLESS,
     "AltUp streams, Laurel, per-layer inputs, shared KV, Gaussian top-k sparsity"),
    ("gemma3n", parse_gemma3n, frozenset({"text_config", "tie_word_embeddings", *_MM_KEYS}),
     frozenset(), "multimodal checkpoint: the language model only"),
]
