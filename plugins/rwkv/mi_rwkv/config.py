"""RWKV configuration: one typed config for RWKV-6 (HF format) and RWKV-7 (fla format).

Version-specific axes are typed fields; generic code never checks architecture names.
Low-rank widths are read from the tensor shapes (the configs of real checkpoints do not
always carry them) and cross-checked against the config where it does. Parsing is strict:
every key is typed and range-checked without coercion (``"false"`` is not False, 2.7 is not
2), keys that would change the numbers are implemented or refused, and a key that is neither
read nor known to be harmless is refused (the lists are below and in docs/RWKV.md).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import attrs

from mi_core.plugin import (
    ConfigError, ConfigFields, UnsupportedModelError, check_memory, is_generic_harmless,
)

#: model_type values of RWKV generations mi-rwkv does not implement, with their names.
UNSUPPORTED_TYPES = {"rwkv": "RWKV-4 (Dove)", "rwkv4": "RWKV-4 (Dove)", "rwkv5": "RWKV-5 (Eagle)"}


def _positive(inst: Any, attr: "attrs.Attribute[Any]", value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"RwkvConfig.{attr.name} = {value!r}: must be a finite positive number")


def _rank(inst: Any, attr: "attrs.Attribute[Any]", value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"RwkvConfig.{attr.name} = {value!r}: must be an integer >= 0")


@attrs.frozen
class RwkvConfig:
    """Shape and numerics of an RWKV-6 or RWKV-7 model.

    ``version`` selects the time-mix / channel-mix kernels (6: data-dependent token shift,
    diagonal decay, receptance-gated FFN; 7: static lerp, diag + rank-1 transition, plain FFN).
    Built by :func:`parse_v6` / :func:`parse_v7`, which check every key against its file;
    the validators here keep a directly built config honest too.
    """

    version: int = attrs.field(validator=attrs.validators.in_((6, 7)))
    vocab_size: int = attrs.field(validator=_positive)
    hidden_size: int = attrs.field(validator=_positive)
    num_layers: int = attrs.field(validator=_positive)
    head_dim: int = attrs.field(validator=_positive)
    num_heads: int = attrs.field(validator=_positive)
    intermediate_size: int = attrs.field(validator=_positive)
    norm_eps: float = attrs.field(validator=_positive)
    #: eps of the per-head GroupNorm after the WKV (v6: 1e-5 * head_size_divisor**2;
    #: v7: head_dim * norm_eps).
    group_norm_eps: float = attrs.field(validator=_positive)
    #: v6: rank of the five-way ddlerp LoRA (time_maa_w1/w2) and of the decay LoRA.
    time_mix_rank: int = attrs.field(default=0, validator=_rank)
    time_decay_rank: int = attrs.field(default=0, validator=_rank)
    #: v7: ranks of the decay / in-context learning rate / value-residual / gate LoRAs.
    decay_rank: int = attrs.field(default=0, validator=_rank)
    a_rank: int = attrs.field(default=0, validator=_rank)
    v_rank: int = attrs.field(default=0, validator=_rank)
    gate_rank: int = attrs.field(default=0, validator=_rank)
    head_size_divisor: float = attrs.field(default=1.0, validator=_positive)
    tie_word_embeddings: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    bos_token_id: int | None = None
    eos_token_id: int | None = 0

    def __attrs_post_init__(self) -> None:
        if self.num_heads * self.head_dim != self.hidden_size:
            raise ConfigError(f"RwkvConfig: num_heads {self.num_heads} x head_dim "
                              f"{self.head_dim} != hidden_size {self.hidden_size}")


#: Keys beyond :data:`mi_core.configread.GENERIC_HARMLESS` any RWKV ``config.json`` may
#: carry without changing the numbers: ``auto_map`` names the custom modeling code of the
#: flash-linear-attention / RWKV checkpoints, which mi-rwkv implements itself.
RWKV_HARMLESS = frozenset({"auto_map"})


#: RWKV-6 (HF ``Rwkv6Config``) keys mi-rwkv reads (each typed and range-checked).
V6_READ = ("vocab_size", "hidden_size", "num_hidden_layers", "head_size", "attention_hidden_size",
           "intermediate_size", "head_size_divisor", "layer_norm_epsilon", "tie_word_embeddings",
           "bos_token_id", "eos_token_id")
#: RWKV-6 keys known not to change F32 numbers: ``num_attention_heads`` is unused by the
#: reference code (heads come from ``head_size``); ``rescale_every`` is an fp16 overflow
#: guard (halving the residual every N layers, undone by the next LayerNorm).
V6_HARMLESS = ("num_attention_heads", "rescale_every", "context_length")

#: RWKV-7 (flash-linear-attention ``RWKV7Config``) keys mi-rwkv reads. ``norm_bias``,
#: ``norm_first``, ``hidden_act``, ``attn`` and ``value_dim`` are accepted only at the value
#: this implementation computes (True, True, "sqrelu", null, hidden_size) and refused otherwise.
V7_READ = ("vocab_size", "hidden_size", "num_hidden_layers", "head_dim", "num_heads",
           "num_attention_heads", "attention_hidden_size", "intermediate_size", "hidden_ratio",
           "decay_low_rank_dim", "a_low_rank_dim", "v_low_rank_dim", "gate_low_rank_dim",
           "norm_eps", "norm_bias", "norm_first", "hidden_act", "attn", "value_dim",
           "tie_word_embeddings", "bos_token_id", "eos_token_id")
#: RWKV-7 keys that select kernels or training behaviour only.
V7_HARMLESS = ("attn_mode", "fuse_norm", "fuse_cross_entropy", "fuse_linear_cross_entropy",
               "use_l2warp", "max_position_embeddings")


class _Keys(ConfigFields):
    """Typed, strict access to one config.json: no coercion, errors name key, value, file."""

    required_word = "key"

    def __init__(self, cfg: Mapping[str, Any], where: str) -> None:
        super().__init__(cfg, where, error=ConfigError)

    def number(self, key: str, default: float) -> float:  # type: ignore[override]
        """A finite number > 0 (int or float in JSON); `default` when absent or null."""
        return super().number(key, default, gt=0)

    def token_id(self, key: str, default: int | None) -> int | None:
        return self.integer(key, default, minimum=0)

    def only(self, key: str, allowed: Any, why: str) -> None:
        """Refuse `key` unless absent, null or equal to `allowed` (a value we implement)."""
        v = self.get(key)
        if v is not None and (type(v) is not type(allowed) or v != allowed):
            raise self.fail(key, why)

    def check_known(self, version: int, read: tuple[str, ...], harmless: tuple[str, ...]) -> None:
        unknown = sorted(k for k, v in self.cfg.items() if k not in read and k not in harmless
                         and k not in RWKV_HARMLESS and not is_generic_harmless(k, v))
        if unknown:
            raise ConfigError(f"{self.where}: unknown RWKV-{version} key(s) {unknown}: mi-rwkv "
                              "cannot tell whether they change the numbers (docs/RWKV.md lists "
                              "the keys it reads and those known to be harmless)")


#: Bounds no real checkpoint comes near: past them a config is refused while parsing,
#: whatever the memory here (which says nothing about a checkpoint detection must claim).
MAX_PARAMS, MAX_LAYERS, MAX_SIZE = 10 * 10**12, 100_000, 2**26


def check_size(cfg: RwkvConfig, where: str, dtype: Any = None, device: Any = None) -> None:
    """ConfigError naming the size keys when they are past the fixed bounds above (always,
    before any per-layer table is built) or, given `dtype` (load time, before a tensor is
    read), unless the parameters `cfg` implies fit in `dtype` on `device`
    (MI_SKIP_MEMORY_CHECK=1 skips that memory check)."""
    c, inter = cfg.hidden_size, cfg.intermediate_size
    params = cfg.vocab_size * c * (1 if cfg.tie_word_embeddings else 2) + cfg.num_layers * (
        5 * c * c + 2 * c * inter)  # r, k, v, (g,) o and the channel mix; LoRAs left out
    what = (f"{where}: num_hidden_layers = {cfg.num_layers}, hidden_size = {c}, "
            f"intermediate_size = {inter}, vocab_size = {cfg.vocab_size} imply about "
            f"{params:.3g} parameters")
    if (cfg.num_layers > MAX_LAYERS or max(c, inter, cfg.vocab_size) > MAX_SIZE
            or params > MAX_PARAMS):
        raise ConfigError(f"{what} ({params / 2**30:,.3g} GiB at one byte each): past what any "
                          f"real checkpoint comes near ({MAX_LAYERS:,} layers, sizes of "
                          f"{MAX_SIZE:,}, {MAX_PARAMS:.3g} parameters); refused before allocating")
    if dtype is not None:
        check_memory(what, params * dtype.itemsize, device)


def _shape_rank(shapes: Mapping[str, tuple[int, ...]], name: str, axis: int) -> int | None:
    shape = shapes.get(name)
    return int(shape[axis]) if shape is not None and len(shape) > axis else None


def _lora_rank(k: _Keys, key: str, shapes: Mapping[str, tuple[int, ...]], tensor: str,
               axis: int, default: int) -> int:
    """A LoRA width: the tensor's, checked against the config's when both are given."""
    declared = k.integer(key, None)
    found = _shape_rank(shapes, tensor, axis)
    if declared is not None and found is not None and declared != found:
        raise k.fail(key, f"the checkpoint's {tensor} has rank {found}")
    return found if found is not None else declared if declared is not None else default


def _hidden(k: _Keys) -> int:
    hidden = k.integer("hidden_size")
    att = k.integer("attention_hidden_size", hidden)
    if att != hidden:
        raise k.fail("attention_hidden_size", f"!= hidden_size {hidden} is not supported")
    return hidden


def parse_v6(cfg: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
             where: str = "config.json") -> RwkvConfig:
    """RWKV-6 from an HF-format ``config.json`` (``model_type: rwkv6``)."""
    k = _Keys(cfg, where)
    k.check_known(6, V6_READ, V6_HARMLESS)
    hidden = _hidden(k)
    head = k.integer("head_size", 64)
    if hidden % head:
        raise k.fail("head_size", f"head size {head} does not divide hidden size {hidden}")
    divisor = k.number("head_size_divisor", 8.0)
    try:
        group_norm_eps = 1e-5 * divisor ** 2
    except OverflowError:
        group_norm_eps = math.inf
    if group_norm_eps == math.inf:
        raise k.fail("head_size_divisor", "too large (its GroupNorm eps 1e-5 * divisor^2 overflows)")
    # The HF code hard-codes the LoRA widths: 32 / 64, or 64 / 128 at hidden size 4096.
    tm_default, td_default = (64, 128) if hidden == 4096 else (32, 64)
    a = "rwkv.blocks.0.attention."
    cfg_v6 = RwkvConfig(
        version=6, vocab_size=k.integer("vocab_size"), hidden_size=hidden,
        num_layers=k.integer("num_hidden_layers"), head_dim=head, num_heads=hidden // head,
        intermediate_size=k.integer("intermediate_size", int((hidden * 3.5) // 32 * 32)),
        norm_eps=k.number("layer_norm_epsilon", 1e-5),
        group_norm_eps=group_norm_eps, head_size_divisor=divisor,
        time_mix_rank=_shape_rank(shapes, a + "time_maa_w2", 1) or tm_default,
        time_decay_rank=_shape_rank(shapes, a + "time_decay_w1", 1) or td_default,
        tie_word_embeddings=k.flag("tie_word_embeddings", False),
        bos_token_id=k.token_id("bos_token_id", None), eos_token_id=k.token_id("eos_token_id", 0),
    )
    check_size(cfg_v6, where)
    return cfg_v6


def _v7_heads(k: _Keys, hidden: int) -> tuple[int, int]:
    """(head_dim, num_heads) from head_dim and / or num_heads (alias num_attention_heads)."""
    heads = k.integer("num_heads", None)
    alias = k.integer("num_attention_heads", None)
    if heads is not None and alias is not None and heads != alias:
        raise k.fail("num_attention_heads", f"!= num_heads {heads}")
    heads = heads if heads is not None else alias
    head = k.integer("head_dim", None)
    if head is None:
        if heads is not None:
            if hidden % heads:
                raise k.fail("num_heads", f"num_heads {heads} does not divide hidden size {hidden}")
            head = hidden // heads
        else:
            head = 64
    if hidden % head:
        raise k.fail("head_dim", f"head size {head} does not divide hidden size {hidden}")
    if heads is not None and heads * head != hidden:
        raise k.fail("num_heads", f"num_heads {heads} != hidden_size / head_dim = {hidden} / {head}")
    return head, hidden // head


def parse_v7(cfg: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
             where: str = "config.json") -> RwkvConfig:
    """RWKV-7 from a flash-linear-attention ``config.json`` (``model_type: rwkv7``)."""
    k = _Keys(cfg, where)
    k.check_known(7, V7_READ, V7_HARMLESS)
    hidden = _hidden(k)
    layers = k.integer("num_hidden_layers")
    head, heads = _v7_heads(k, hidden)
    k.only("norm_bias", True, "LayerNorms without bias are not implemented")
    k.only("norm_first", True, "only pre-norm RWKV-7 (a LayerNorm on the embeddings) is implemented")
    k.only("hidden_act", "sqrelu", "the channel mix is relu(x)^2 ('sqrelu') only")
    k.only("attn", None, "hybrid RWKV-7 / attention models are not supported")
    inter = k.integer("intermediate_size", None)
    if inter is None:
        width = hidden * k.number("hidden_ratio", 4.0)
        if not 1 <= width < 2 ** 31:
            raise k.fail("hidden_ratio", f"gives an MLP width of {width} for hidden size {hidden}")
        inter = int(round(width))
    eps = k.number("norm_eps", 1e-5)
    if head * eps == math.inf:
        raise k.fail("norm_eps", "too large (the GroupNorm eps head_dim * norm_eps overflows)")
    p = "model.layers.0.attn."
    out = RwkvConfig(
        version=7, vocab_size=k.integer("vocab_size"), hidden_size=hidden, num_layers=layers,
        head_dim=head, num_heads=heads, intermediate_size=inter, norm_eps=eps,
        group_norm_eps=head * eps,
        decay_rank=_lora_rank(k, "decay_low_rank_dim", shapes, p + "w_lora.lora.0.weight", 0, 64),
        a_rank=_lora_rank(k, "a_low_rank_dim", shapes, p + "a_lora.lora.0.weight", 0, 64),
        v_rank=_lora_rank(k, "v_low_rank_dim", shapes, "model.layers.1.attn.v_lora.lora.0.weight",
                          0, 32),
        gate_rank=_lora_rank(k, "gate_low_rank_dim", shapes, p + "g_lora.lora.0.weight", 0, 128),
        tie_word_embeddings=k.flag("tie_word_embeddings", False),
        bos_token_id=k.token_id("bos_token_id", None), eos_token_id=k.token_id("eos_token_id", 0),
    )
    check_size(out, where)  # before value_dim, a list of num_hidden_layers entries
    value_dim = cfg.get("value_dim")
    if value_dim is not None and value_dim != hidden and value_dim != [hidden] * layers:
        raise k.fail("value_dim", f"value_dim must equal hidden_size {hidden} in every layer")
    return out


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
