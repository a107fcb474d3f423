"""Hook points: named locations in a forward pass, in TransformerLens spelling.

The standard names (and their shape groups, used by :mod:`mi_core.shapes`) are described
once here. A name here is "known" to :meth:`HookPoint.parse`; any other name is a custom
point, kept verbatim, unless a plugin declares it (``mi_declare_hook_points``).
"""

from __future__ import annotations

import re
from typing import Callable, Union

import attrs

from mi_core.errors import HookError, PluginError

#: Global (non-layer) points.
GLOBAL_NAMES = ("hook_embed", "hook_pos_embed", "ln_final.hook_scale",
                "ln_final.hook_normalized")

#: Per-layer suffixes (``blocks.{i}.<suffix>``), grouped by shape.
_RESID = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out",
          "hook_mlp_out", "ln1.hook_normalized", "ln2.hook_normalized", "attn.hook_in",
          "mlp.hook_in", "hook_mlp_in", "hook_mixer_out")  # mixer_out: a non-attention mixer's
_SCALE = ("ln1.hook_scale", "ln2.hook_scale")
_Q_HEADS = ("attn.hook_q", "attn.hook_rot_q", "attn.hook_z")
_KV_HEADS = ("attn.hook_k", "attn.hook_v", "attn.hook_rot_k")
_PATTERN = ("attn.hook_attn_scores", "attn.hook_pattern")
_MLP = ("mlp.hook_pre", "mlp.hook_post", "mlp.hook_pre_linear")
#: TransformerLens' per-head residual inputs (opt-in): [batch, seq, heads (kv heads for k/v), d_model]
_Q_INPUT = ("hook_attn_in", "hook_q_input")
_KV_INPUT = ("hook_k_input", "hook_v_input")

LAYER_SUFFIXES = (_RESID + _SCALE + _Q_HEADS + _KV_HEADS + _PATTERN + _MLP + _Q_INPUT
                  + _KV_INPUT + ("attn.hook_result",))

#: The one point where a :class:`mi_core.Knockout` (an additive pre-softmax mask) means removal.
PRE_SOFTMAX_SCORES = "attn.hook_attn_scores"


_LAYER_RE = re.compile(r"^blocks\.(\d+)\.(.+)$")

#: Names accepted on input and mapped to their canonical TransformerLens spelling.
_ALIASES_GLOBAL = {"hook_final_norm": "ln_final.hook_normalized"}
_ALIASES_LAYER = {"attn.hook_scores": "attn.hook_attn_scores",
                  # TransformerLens puts the per-head inputs on the block, not the attention
                  "attn.hook_q_input": "hook_q_input", "attn.hook_k_input": "hook_k_input",
                  "attn.hook_v_input": "hook_v_input"}

#: Per-layer suffixes known by name: the standard ones, plus those plugins declare
#: (:func:`declare_layer_points`). Any other name is a custom point, kept verbatim.
KNOWN_LAYER_SUFFIXES: set[str] = set(LAYER_SUFFIXES)
KNOWN_GLOBAL_NAMES = GLOBAL_NAMES
#: Points computed only when hooked (extra work or memory): a default run_with_cache skips them
#: (plugins add theirs through ``mi_opt_in_hook_points``).
OPT_IN_SUFFIXES: set[str] = {"attn.hook_result", "hook_attn_in", "hook_q_input",
                             "hook_k_input", "hook_v_input"}


class LayerIndex(int):
    """A hook point's layer: an int that is also callable, so TransformerLens hook code that
    calls ``hook.layer()`` runs unchanged (``hook.layer == 3`` and ``hook.layer() == 3``)."""

    def __call__(self) -> int:
        return int(self)


@attrs.frozen(repr=False)
class HookPoint:
    """A named location in a forward pass, in TransformerLens spelling.

    ``HookPoint.parse("blocks.5.attn.hook_pattern") == HookPoint.attn_pattern(5)``.
    Unknown names are kept verbatim as custom points (``is_custom``). Two points are equal
    when their names are: `layer`, `suffix` and `is_custom` derive from the name (and
    `is_custom` may change when a plugin declares the point).
    """

    name: str
    layer: int | None = attrs.field(default=None, eq=False)
    suffix: str = attrs.field(default="", eq=False)
    is_custom: bool = attrs.field(default=False, eq=False)

    @classmethod
    def parse(cls, name: "str | HookPoint") -> "HookPoint":
        if isinstance(name, HookPoint):
            return name
        if not isinstance(name, str):
            raise HookError(f"hook point must be a str or HookPoint, got {type(name).__name__}")
        return _parse_cached(name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r})"

    # Factories, one per documented point.
    @classmethod
    def embed(cls) -> "HookPoint":
        return cls.parse("hook_embed")

    @classmethod
    def final_norm(cls) -> "HookPoint":
        return cls.parse("ln_final.hook_normalized")

    @classmethod
    def ln_final_scale(cls) -> "HookPoint":
        return cls.parse("ln_final.hook_scale")

    @classmethod
    def layer_point(cls, layer: int, suffix: str) -> "HookPoint":
        return cls.parse(f"blocks.{int(layer)}.{suffix}")

    @classmethod
    def custom(cls, name: str) -> "HookPoint":
        return cls(name=name, is_custom=True)


def _factory(suffix: str) -> Callable[[type[HookPoint], int], HookPoint]:
    def make(cls: type[HookPoint], layer: int) -> HookPoint:
        return cls.layer_point(layer, suffix)

    make.__doc__ = f"``blocks.{{layer}}.{suffix}``"
    return classmethod(make)  # type: ignore[return-value]


_STANDARD_FACTORIES = {
    "resid_pre": "hook_resid_pre", "resid_mid": "hook_resid_mid", "resid_post": "hook_resid_post",
    "ln1_scale": "ln1.hook_scale", "ln1_normalized": "ln1.hook_normalized",
    "ln2_scale": "ln2.hook_scale", "ln2_normalized": "ln2.hook_normalized",
    "attn_q": "attn.hook_q", "attn_k": "attn.hook_k", "attn_v": "attn.hook_v",
    "attn_rot_q": "attn.hook_rot_q", "attn_rot_k": "attn.hook_rot_k",
    "attn_scores": "attn.hook_attn_scores", "attn_pattern": "attn.hook_pattern",
    "attn_z": "attn.hook_z", "attn_result": "attn.hook_result", "attn_out": "hook_attn_out",
    "mixer_out": "hook_mixer_out",
    "attn_in": "attn.hook_in", "mlp_in": "mlp.hook_in",
    "mlp_pre": "mlp.hook_pre", "mlp_post": "mlp.hook_post", "mlp_out": "hook_mlp_out",
    "mlp_pre_linear": "mlp.hook_pre_linear",
    "q_input": "hook_q_input", "k_input": "hook_k_input", "v_input": "hook_v_input",
}
for _meth, _suffix in _STANDARD_FACTORIES.items():
    setattr(HookPoint, _meth, _factory(_suffix))

_SUFFIX_RE = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*\.)*hook_[A-Za-z0-9_]+$")
_DECLARED: dict[str, str] = {}  # factory name -> suffix, from plugins


def declare_layer_points(factories: "dict[str, str]", owner: str = "a plugin") -> None:
    """Make per-layer suffixes known (not custom) and add ``HookPoint.<name>(layer)`` factories.

    `factories`: factory name -> suffix, e.g. ``{"my_state": "mixer.hook_state"}``. A backend
    plugin declares its own points this way (through ``mi_declare_hook_points``); the core
    knows only the standard ones. Declaring the same pair twice is a no-op; a name that
    clashes with another meaning is a PluginError naming it and `owner`.
    """
    for name, suffix in factories.items():
        if not (isinstance(name, str) and name.isidentifier() and isinstance(suffix, str)
                and _SUFFIX_RE.match(suffix)):
            raise PluginError(f"{owner}: cannot declare hook point factory {name!r} -> "
                              f"{suffix!r}: need an identifier and a suffix like 'x.hook_y'")
        known = _STANDARD_FACTORIES.get(name) or _DECLARED.get(name)
        if known is not None and known != suffix:
            raise PluginError(f"{owner}: HookPoint.{name} already means 'blocks.{{i}}.{known}', "
                              f"not {suffix!r}")
        if known is None and hasattr(HookPoint, name):
            raise PluginError(f"{owner}: HookPoint.{name} is already an attribute")
    for name, suffix in factories.items():
        if name not in _DECLARED and name not in _STANDARD_FACTORIES:
            setattr(HookPoint, name, _factory(suffix))
            _DECLARED[name] = suffix
        KNOWN_LAYER_SUFFIXES.add(suffix)
    _PARSE_CACHE.clear()  # earlier parses may have called these points custom


_PARSE_CACHE: dict[str, HookPoint] = {}


def _parse_cached(name: str) -> HookPoint:
    hp = _PARSE_CACHE.get(name)
    if hp is not None:
        return hp
    canon = _ALIASES_GLOBAL.get(name, name)
    m = _LAYER_RE.match(canon)
    if m:
        layer, suffix = int(m.group(1)), _ALIASES_LAYER.get(m.group(2), m.group(2))
        hp = HookPoint(name=f"blocks.{layer}.{suffix}", layer=LayerIndex(layer), suffix=suffix,
                       is_custom=suffix not in KNOWN_LAYER_SUFFIXES)
    else:
        hp = HookPoint(name=canon, suffix=canon, is_custom=canon not in KNOWN_GLOBAL_NAMES)
    if len(_PARSE_CACHE) < 100_000:
        _PARSE_CACHE[name] = hp
    return hp


HookLike = Union[str, HookPoint]


def hook_name(point: HookLike) -> str:
    """The canonical name of `point` (aliases resolved)."""
    return HookPoint.parse(point).name
