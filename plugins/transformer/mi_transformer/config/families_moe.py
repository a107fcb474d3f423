"""Parsers of the mixture-of-experts families (the MLP is :mod:`mi_transformer.moe`):
Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE."""

from __future__ import annotations

from typing import Any

from mi_core.plugin import ConfigError

from mi_transformer.config.axes import MoeConfig, TransformerConfig
from mi_transformer.config.common import _base, _default_theta, _finish, _full, _ropes_by_type
from mi_transformer.config.families_llama import _qwen
from mi_transformer.config.reader import ConfigReader
from mi_transformer.config.size import check_size


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
    experts, size, hidden = next(iter(given.values())), r.int(size_key), r.int("hidden_size")
    layers = r.int("num_hidden_layers")  # the experts, at one byte each, before any is named
    check_size(r.src, {"num_hidden_layers": layers, next(iter(given)): experts, size_key: size},
               layers * hidden * experts * 3 * size)
    return MoeConfig(num_experts=experts, top_k=r.int("num_experts_per_tok"),
                     expert_size=size, norm_topk_prob=norm,
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
               expert_names=("w1", "w3", "w2"), accumulate_float32=True)
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

