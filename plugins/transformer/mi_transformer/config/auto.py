"""Parsing a ``config.json``: the family's parser for a known ``model_type``
(:func:`parse_config`), else a LLaMA-like config read off the tensor names
(:func:`auto_config`); either way every key must be read, known to be harmless, or at its
neutral value (:mod:`mi_transformer.config.neutral`), and a ``quantization_config`` must be
one :mod:`mi_transformer.quant` dequantizes."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import attrs

from mi_core.plugin import ConfigError, UnsupportedModelError

from mi_transformer.config.axes import MlpLayout, QkvLayout, TransformerConfig
from mi_transformer.config.common import _all_sliding, _base
from mi_transformer.config.families_llama import parse_llama
from mi_transformer.config.families_recent import REFUSED
from mi_transformer.config.neutral import policy_violations
from mi_transformer.config.reader import ConfigReader, UnknownKeysError
from mi_transformer.config.registry import _LLAMA, FAMILIES, Family, _family
from mi_transformer.quant import read_quant_config


def _run(family: Family, cfg: Any, src: str, parse: Callable[[ConfigReader], TransformerConfig]
         | None = None) -> TransformerConfig:
    r = ConfigReader(cfg, src)
    read_quant_config(cfg, src)  # an unsupported quant_method is refused by name
    r.read.add("quantization_config")
    try:
        out = (parse or family.parse)(r)
    except ConfigError as exc:
        if src in str(exc):
            raise
        # a relation TransformerConfig checks on its axes: say which file it came from
        raise ConfigError(f"{src}: {exc}") from None
    # auto_map names custom modeling code: for a family implemented here transformers (without
    # trust_remote_code) ignores it as well; an unknown model_type with one is refused
    harmless = family.harmless | ({"auto_map"} if family is not AUTO_FAMILY else set())
    unknown = policy_violations(r.cfg, r.read, harmless, family.neutral, out, src)
    if unknown and family is AUTO_FAMILY:
        raise UnknownKeysError(
            f"{src}: mi-transformer does not implement model_type {out.model_type!r}, and its "
            f"config is not LLaMA-like (auto-config): keys it does not read and does not know "
            f"to be harmless (they may change the numbers): {', '.join(unknown)}", unknown)
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
        return _stacked_experts(_run(family, cfg, src), tensor_names)
    if mt in REFUSED:
        raise UnsupportedModelError(f"{src}: model_type {mt!r} is not supported by the "
                                    f"transformer backend: {REFUSED[mt]}")
    return auto_config(cfg, src, list(tensor_names or []))


def _stacked_experts(out: TransformerConfig, tensor_names: Iterable[str] | None
                     ) -> TransformerConfig:
    """Per-expert MoE families (Qwen2-MoE, Qwen3-MoE, Mixtral, ...) as transformers 5 holds
    them in memory: the experts stacked in ``experts.gate_up_proj`` [E, 2 d_expert, d_model]
    (rows [gate | up]) and ``experts.down_proj`` [E, d_model, d_expert], which is what a
    checkpoint of transformers' model read from GGUF holds (its save_pretrained has no
    per-expert layout to return to). Read off the tensor names, not the config: the same
    config describes both layouts."""
    moe = out.moe
    if moe is None or not tensor_names or moe.fused or moe.fused_experts or moe.fused_linear:
        return out
    names = set(tensor_names)
    layer = next((i for i, m in enumerate(out.layer_moe) if m), 0) if out.layer_moe else 0
    from mi_transformer.name_tables import NAME_TABLES

    # (the family's layer prefix: Nemotron-H's backbone.layers.{i}., whose plain experts
    # stack as experts.up_proj / down_proj); the names only, as mi_transformer.moe's
    # expected_moe_shapes spells them (not imported: the config package stays below it)
    prefix = NAME_TABLES[out.weight_names].layer.format(i=layer)
    m = prefix + moe.block + "." if moe.block else prefix
    _, up, down = moe.expert_names
    per_expert = f"{m}experts.0.{down}.weight"
    stacked = {f"{m}experts.{down}", f"{m}experts.{up}" if not moe.gated
               else f"{m}experts.gate_up_proj"}
    if per_expert in names or not stacked <= names:
        return out
    return attrs.evolve(out, moe=attrs.evolve(moe, fused_linear=True))


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
