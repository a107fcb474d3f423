"""RWKV configuration: one typed config for RWKV-6 (HF format) and RWKV-7 (fla format).

Version-specific axes are typed fields; generic code never checks architecture names.
Low-rank widths are read from the tensor shapes (the configs of real checkpoints do not
always carry them) and cross-checked against the config where it does.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from mi_core.errors import ConfigError, UnsupportedModelError
from mi_core.loading import require_field

#: model_type values of RWKV generations mi-rwkv does not implement, with their names.
UNSUPPORTED_TYPES = {"rwkv": "RWKV-4 (Dove)", "rwkv4": "RWKV-4 (Dove)", "rwkv5": "RWKV-5 (Eagle)"}


@attrs.frozen
class RwkvConfig:
    """Shape and numerics of an RWKV-6 or RWKV-7 model.

    ``version`` selects the time-mix / channel-mix kernels (6: data-dependent token shift,
    diagonal decay, receptance-gated FFN; 7: static lerp, diag + rank-1 transition, plain FFN).
    """

    version: int
    vocab_size: int
    hidden_size: int
    num_layers: int
    head_dim: int
    num_heads: int
    intermediate_size: int
    norm_eps: float
    #: eps of the per-head GroupNorm after the WKV (v6: 1e-5 * head_size_divisor**2;
    #: v7: head_dim * norm_eps).
    group_norm_eps: float
    #: v6: rank of the five-way ddlerp LoRA (time_maa_w1/w2) and of the decay LoRA.
    time_mix_rank: int = 0
    time_decay_rank: int = 0
    #: v7: ranks of the decay / in-context learning rate / value-residual / gate LoRAs.
    decay_rank: int = 0
    a_rank: int = 0
    v_rank: int = 0
    gate_rank: int = 0
    head_size_divisor: float = 1.0
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = 0

    @property
    def attention_size(self) -> int:
        return self.num_heads * self.head_dim


def _check_heads(hidden: int, head_dim: int, where: str) -> int:
    if head_dim <= 0 or hidden % head_dim:
        raise ConfigError(f"{where}: head size {head_dim} does not divide hidden size {hidden}")
    return hidden // head_dim


def _rank(shapes: Mapping[str, tuple[int, ...]], name: str, axis: int, default: int) -> int:
    shape = shapes.get(name)
    return int(shape[axis]) if shape is not None and len(shape) > axis else default


def parse_v6(cfg: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
             where: str = "config.json") -> RwkvConfig:
    """RWKV-6 from an HF-format ``config.json`` (``model_type: rwkv6``)."""
    hidden = int(require_field(cfg, "hidden_size", where))
    layers = int(require_field(cfg, "num_hidden_layers", where))
    head = int(cfg.get("head_size") or 64)
    att = int(cfg.get("attention_hidden_size") or hidden)
    if att != hidden:
        raise ConfigError(f"{where}: attention_hidden_size {att} != hidden_size {hidden} "
                          "is not supported")
    heads = _check_heads(hidden, head, where)
    inter = cfg.get("intermediate_size") or int((hidden * 3.5) // 32 * 32)
    divisor = float(cfg.get("head_size_divisor") or 8)
    # The HF code hard-codes the LoRA widths: 32 / 64, or 64 / 128 at hidden size 4096.
    tm_default, td_default = (64, 128) if hidden == 4096 else (32, 64)
    return RwkvConfig(
        version=6, vocab_size=int(require_field(cfg, "vocab_size", where)), hidden_size=hidden,
        num_layers=layers, head_dim=head, num_heads=heads, intermediate_size=int(inter),
        norm_eps=float(cfg.get("layer_norm_epsilon") or 1e-5),
        group_norm_eps=1e-5 * divisor ** 2, head_size_divisor=divisor,
        time_mix_rank=_rank(shapes, "rwkv.blocks.0.attention.time_maa_w2", 1, tm_default),
        time_decay_rank=_rank(shapes, "rwkv.blocks.0.attention.time_decay_w1", 1, td_default),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=cfg.get("bos_token_id"), eos_token_id=cfg.get("eos_token_id", 0),
    )


def parse_v7(cfg: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
             where: str = "config.json") -> RwkvConfig:
    """RWKV-7 from a flash-linear-attention ``config.json`` (``model_type: rwkv7``)."""
    hidden = int(require_field(cfg, "hidden_size", where))
    layers = int(require_field(cfg, "num_hidden_layers", where))
    att = int(cfg.get("attention_hidden_size") or hidden)
    if att != hidden:
        raise ConfigError(f"{where}: attention_hidden_size {att} != hidden_size {hidden} "
                          "is not supported")
    head = cfg.get("head_dim")
    if head is None and cfg.get("num_heads"):
        nh = int(cfg["num_heads"])
        if hidden % nh:
            raise ConfigError(f"{where}: num_heads {nh} does not divide hidden size {hidden}")
        head = hidden // nh
    head = int(head or 64)
    heads = _check_heads(hidden, head, where)
    if cfg.get("num_heads") and int(cfg["num_heads"]) != heads:
        raise ConfigError(f"{where}: num_heads {cfg['num_heads']} != hidden_size / head_dim "
                          f"= {hidden} / {head}")
    inter = cfg.get("intermediate_size") or int(round(hidden * float(cfg.get("hidden_ratio") or 4.0)))
    eps = float(cfg.get("norm_eps") or 1e-5)
    p = "model.layers.0.attn."
    return RwkvConfig(
        version=7, vocab_size=int(require_field(cfg, "vocab_size", where)), hidden_size=hidden,
        num_layers=layers, head_dim=head, num_heads=heads, intermediate_size=int(inter),
        norm_eps=eps, group_norm_eps=head * eps,
        decay_rank=_rank(shapes, p + "w_lora.lora.0.weight", 0, int(cfg.get("decay_low_rank_dim") or 64)),
        a_rank=_rank(shapes, p + "a_lora.lora.0.weight", 0, int(cfg.get("a_low_rank_dim") or 64)),
        v_rank=_rank(shapes, "model.layers.1.attn.v_lora.lora.0.weight", 0,
                     int(cfg.get("v_low_rank_dim") or 32)),
        gate_rank=_rank(shapes, p + "g_lora.lora.0.weight", 0, int(cfg.get("gate_low_rank_dim") or 128)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=cfg.get("bos_token_id"), eos_token_id=cfg.get("eos_token_id", 0),
    )


def rwkv_version(cfg: Mapping[str, Any] | None, names: list[str] | tuple[str, ...]) -> int | None:
    """6 or 7 from ``model_type`` (or, without one, from tensor names); None if not RWKV.

    Raises UnsupportedModelError for RWKV-4 / RWKV-5 checkpoints, naming the generation.
    """
    mt = str((cfg or {}).get("model_type") or "").lower()
    if mt in UNSUPPORTED_TYPES:
        raise UnsupportedModelError(
            f"{UNSUPPORTED_TYPES[mt]} checkpoint (model_type {mt!r}): mi-rwkv supports RWKV-6 "
            "(model_type 'rwkv6') and RWKV-7 (model_type 'rwkv7') only")
    if mt == "rwkv6":
        return 6
    if mt == "rwkv7":
        return 7
    if mt:
        return None
    s = set(names)
    if any(n.endswith("attn.k_k") for n in s):
        return 7
    if any(n.endswith("attention.time_maa_x") for n in s):
        return 6
    if any(n.endswith("attention.time_decay") for n in s):
        raise UnsupportedModelError("RWKV-4/5 checkpoint (time_decay without time_maa_*): "
                                    "mi-rwkv supports RWKV-6 and RWKV-7 only")
    return None
