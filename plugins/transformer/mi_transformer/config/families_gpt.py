"""Parsers of the GPT-style dense families, which spell their sizes their own way
(:func:`_dense`): learned or partial rotary positions, fused QKV, parallel blocks. GPT-2,
GPT-NeoX, GPT-J, Phi, StableLM, OPT, Falcon."""

from __future__ import annotations

from typing import Any

from mi_core.plugin import ConfigError

from mi_transformer.config.axes import (BlockLayout, MlpLayout, NormType, Positions, QkvLayout,
                                        RopeLayout, TransformerConfig)
from mi_transformer.config.common import _activation, _heads, _rope
from mi_transformer.config.reader import ConfigReader
from mi_transformer.config.size import check_parsed, check_size


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


def _learned(r: ConfigReader, base: dict[str, Any], key: str, offset: int = 0
             ) -> TransformerConfig:
    """Learned absolute positions: a [`key`, d_model] table, checked to fit before it is."""
    max_positions = r.int(key)
    check_size(r.src, {key: max_positions}, max_positions * base["hidden_size"])
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
    base = dict(model_type=model_type, vocab_size=r.int("vocab_size"), hidden_size=d,
                num_layers=r.int(layers), num_heads=h, num_kv_heads=k, head_dim=hd,
                intermediate_size=r.int(inner, 4 * d if inner_default is None else inner_default),
                norm_type=NormType.LAYER_NORM, norm_bias=True,
                norm_eps=r.float(eps, 1e-5, gt=0) if eps else 1e-5,
                activation=_activation(r, act, act_default),
                tie_word_embeddings=r.bool("tie_word_embeddings", tie_default))
    check_parsed(r, base, ("vocab_size", hidden, layers, heads, kv or "", "", inner))
    return base


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
    return _learned(r, base, "n_positions")


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
    return _learned(r, base, "max_position_embeddings", offset=2)


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
    check_parsed(r, base, ("vocab_size", "hidden_size", "num_hidden_layers",
                           "num_attention_heads", "num_kv_heads", "", "ffn_hidden_size"))
    return _gpt_rope(r, base, (), 1.0)
