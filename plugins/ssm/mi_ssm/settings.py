"""The settings of each mixer, read from a family's config through its key table.

A family (the backend that owns the block) names, for each setting, the config key its
checkpoints use (``{"d_state": "state_size", ...}`` for Mamba, ``{"d_state":
"mamba_d_state", ...}`` for a hybrid), and passes the reader it parses the rest of the config
with, so every key read here counts as read there (an unknown key is still refused). A
setting the table does not name takes its default. Values are checked strictly
(:class:`mi_core.plugin.ConfigFields`: no coercion; ranges; relations between settings).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import attrs

from mi_core.plugin import REQUIRED, ConfigError, ConfigFields

#: Activations of the convolution a mixer may name (transformers' ACT2FN spellings).
ACTIVATIONS = ("silu", "swish")


@attrs.frozen
class MambaSettings:
    """Mamba-1 (selective scan, one decay per channel and state dimension)."""

    d_model: int
    d_inner: int
    d_state: int
    d_conv: int
    dt_rank: int
    conv_bias: bool
    proj_bias: bool
    #: Falcon-Mamba: weightless RMS norms of dt (before dt_proj), B and C with this eps
    bcdt_norm_eps: float | None = None
    #: Jamba: the same norms with gains (``dt_layernorm`` / ``b_layernorm`` / ``c_layernorm``)
    bcdt_norm_weights: bool = False


@attrs.frozen
class Mamba2Settings:
    """Mamba-2 (state-space duality: one scalar decay per head, grouped B / C)."""

    d_model: int
    d_inner: int
    n_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    d_conv: int
    conv_bias: bool
    proj_bias: bool
    norm_eps: float
    #: dt is clamped to [lo, hi] after softplus (hi may be inf)
    dt_limit: tuple[float, float] = (0.0, math.inf)
    #: the gated output: "after_gate" rmsnorm(y * silu(z)) * w (Mamba-2, Bamba, ...);
    #: "before_gate" (rmsnorm(y) * w) * silu(z); "none" y * silu(z), no norm tensor (Falcon-H1)
    gate_norm: str = "after_gate"
    #: multipliers of in_proj's five parts [z, x, B, C, dt] (Falcon-H1's mup vector)
    proj_scales: tuple[float, float, float, float, float] | None = None
    #: out_proj has a bias (None: as proj_bias; Falcon-H1 names it apart, projectors_bias)
    out_bias: bool | None = None

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state

    @property
    def has_out_bias(self) -> bool:
        return self.proj_bias if self.out_bias is None else self.out_bias


class _Keys:
    """The family's key table over its reader: ``int("d_state")`` reads ``keys["d_state"]``."""

    def __init__(self, r: ConfigFields, keys: Mapping[str, str]) -> None:
        self.r, self.keys = r, keys

    def _key(self, name: str, default: Any) -> str | None:
        key = self.keys.get(name)
        if key is None and default is REQUIRED:
            raise ConfigError(f"{self.r.where}: the family's key table names no config key for "
                              f"the mixer setting {name!r}")
        return key

    def int(self, name: str, default: Any = REQUIRED) -> Any:
        key = self._key(name, default)
        return default if key is None else self.r.integer(key, default)

    def flag(self, name: str, default: Any = REQUIRED) -> Any:
        key = self._key(name, default)
        return default if key is None else self.r.flag(key, default)

    def number(self, name: str, default: Any = REQUIRED, **bounds: float) -> Any:
        key = self._key(name, default)
        return default if key is None else self.r.number(key, default, **bounds)

    def activation(self) -> None:
        key = self.keys.get("act")
        if key is not None:
            self.r.text(key, "silu", choices=ACTIVATIONS)

    def fail(self, name: str, why: str) -> ConfigError:
        key = self.keys.get(name, name)
        return ConfigError(f"{self.r.where}: {key} = {self.r.get(key)!r}: {why}")


def _d_inner(k: _Keys, hidden: int) -> int:
    """The stored intermediate size where the table names one and the config sets it, else
    expand * hidden: transformers 5's Mamba / Falcon-Mamba configs compute expand * hidden
    and then let a given ``intermediate_size`` override it (falcon-mamba-7b publishes
    ``expand: 16`` beside its real width ``intermediate_size: 8192``; its weights are
    8192 wide)."""
    from_expand = k.int("expand", 2) * hidden  # (read either way: a bad value is refused)
    stored = k.int("d_inner", None)
    if stored is not None and stored < 1:
        raise k.fail("d_inner", "must be >= 1")
    return from_expand if stored is None else stored


def mamba_settings(r: ConfigFields, keys: Mapping[str, str], hidden: int) -> MambaSettings:
    """Mamba-1 settings: d_state, expand (d_inner), d_conv, dt_rank ("auto": ceil(d / 16)),
    conv_bias, proj_bias, act (silu), bcdt_norm_eps (only where the table names it:
    weightless norms of dt, B, C) or bcdt_norm (the same norms with gains, the key naming
    their eps: Jamba's ``rms_norm_eps``)."""
    k = _Keys(r, keys)
    k.activation()
    rank_key = keys.get("dt_rank")
    raw = r.get(rank_key) if rank_key else None
    dt_rank = math.ceil(hidden / 16) if raw in (None, "auto") else k.int("dt_rank")
    which = "bcdt_norm" if "bcdt_norm" in keys else "bcdt_norm_eps"
    eps = k.number(which, None, gt=0) if which in keys else None
    if which in keys and eps is None:
        eps = 1e-6  # transformers' FalconMambaConfig / JambaConfig default
    return MambaSettings(d_model=hidden, d_inner=_d_inner(k, hidden), d_state=k.int("d_state"),
                         d_conv=k.int("d_conv", 4), dt_rank=dt_rank,
                         conv_bias=k.flag("conv_bias", True), proj_bias=k.flag("proj_bias", False),
                         bcdt_norm_eps=eps,
                         bcdt_norm_weights=which == "bcdt_norm" and eps is not None)


def mamba2_settings(r: ConfigFields, keys: Mapping[str, str], hidden: int) -> Mamba2Settings:
    """Mamba-2 settings: n_heads, head_dim, n_groups, d_state, expand (d_inner must equal
    n_heads * head_dim), d_conv, conv_bias, proj_bias, norm_eps (the gated RMS norm), dt_limit
    ([lo, hi], hi may be infinite) or dt_min (Nemotron-H, Zamba2: [dt_min, inf], dt_min
    absent: 0.001, their transformers configs' default), act (silu);
    ``gated_norm`` (where named) only true. Without ``expand`` in the table d_inner is
    n_heads * head_dim.

    Named only by Falcon-H1's table (the defaults are its transformers config's): ``d_ssm``
    (d_inner when set, instead of expand * hidden), ``rms_norm`` (default false: y *
    silu(z) without a norm), ``norm_before_gate`` (default true: the norm before the gate),
    ``proj_scales`` (five multipliers of in_proj's [z | x | B | C | dt]; null: ones),
    ``out_bias`` (out_proj's bias, default false)."""
    k = _Keys(r, keys)
    k.activation()
    heads = k.int("n_heads")
    if "expand" in keys:
        d_ssm = k.int("d_ssm", None)  # Falcon-H1's mamba_d_ssm: set, it is d_inner
        d_inner = _d_inner(k, hidden) if d_ssm is None else d_ssm
        k.int("expand", 2)  # (read either way: a bad value is refused, not ignored)
        # "auto" (Bamba's mamba_d_head): d_inner / n_heads, as transformers resolves it
        head_dim = d_inner // heads if r.get(keys.get("head_dim", "")) == "auto" else \
            k.int("head_dim")
    else:  # no expand in the table (Nemotron-H): d_inner is heads x head_dim
        head_dim = k.int("head_dim")
        d_inner = heads * head_dim
    if heads * head_dim != d_inner:
        raise k.fail("n_heads", f"n_heads * head_dim = {heads} * {head_dim} must equal expand "
                                f"* hidden_size = {d_inner}")
    groups = k.int("n_groups", 1)
    if heads % groups or d_inner % groups:
        raise k.fail("n_groups", f"must divide the {heads} heads")
    if "gated_norm" in keys:  # transformers 4's Mamba2Config.rms_norm: the norm is always there
        r_key = keys["gated_norm"]
        if r.flag(r_key, True) is not True:
            raise k.fail("gated_norm", "only true is supported (the gated RMS norm is applied)")
    return Mamba2Settings(d_model=hidden, d_inner=d_inner, n_heads=heads, head_dim=head_dim,
                          n_groups=groups, d_state=k.int("d_state"), d_conv=k.int("d_conv", 4),
                          conv_bias=k.flag("conv_bias", True), proj_bias=k.flag("proj_bias", False),
                          norm_eps=k.number("norm_eps", 1e-5, gt=0),
                          dt_limit=(k.number("dt_min", 1e-3, ge=0), math.inf) if "dt_min" in keys
                          else _dt_limit(r, keys.get("dt_limit")),
                          gate_norm=_gate_norm(k), proj_scales=_proj_scales(r, keys),
                          out_bias=k.flag("out_bias", False) if "out_bias" in keys else None)


def _gate_norm(k: _Keys) -> str:
    """Where the gated output's RMS norm sits: Mamba-2's norm of y * silu(z) unless the
    table names ``rms_norm`` (Falcon-H1's optional norm, default off) and
    ``norm_before_gate`` (default on)."""
    if "rms_norm" not in k.keys:
        return "after_gate"
    if not k.flag("rms_norm", False):
        k.flag("norm_before_gate", True)  # read (no norm: nothing for it to place)
        return "none"
    return "before_gate" if k.flag("norm_before_gate", True) else "after_gate"


def _proj_scales(r: ConfigFields, keys: Mapping[str, str]
                 ) -> tuple[float, float, float, float, float] | None:
    """Five finite numbers [z, x, B, C, dt], or None (absent, null or all ones)."""
    key = keys.get("proj_scales")
    raw = r.sequence(key) if key is not None else None
    if raw is None:
        return None
    if len(raw) != 5 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                and math.isfinite(v) for v in raw):
        raise ConfigError(f"{r.where}: {key} = {raw!r}: expected five finite numbers, the "
                          f"multipliers of [z, x, B, C, dt]")
    scales = tuple(float(v) for v in raw)
    return None if scales == (1.0,) * 5 else scales  # type: ignore[return-value]


def _dt_limit(r: ConfigFields, key: str | None) -> tuple[float, float]:
    """[lo, hi] with 0 <= lo < hi; hi may be infinite (JSON has no infinity: transformers 5
    writes ``{"__float__": "Infinity"}``)."""
    if key is None or r.get(key) is None:
        return (0.0, math.inf)
    raw = r.sequence(key)

    def value(x: Any) -> float:
        if isinstance(x, Mapping) and dict(x) == {"__float__": "Infinity"}:
            return math.inf
        if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isnan(x):
            raise ConfigError(f"{r.where}: {key} = {raw!r}: expected [low, high] numbers")
        return float(x)

    if len(raw) != 2:
        raise ConfigError(f"{r.where}: {key} = {raw!r}: expected [low, high]")
    lo, hi = value(raw[0]), value(raw[1])
    if not (0 <= lo < hi and math.isfinite(lo)):
        raise ConfigError(f"{r.where}: {key} = {raw!r}: need 0 <= low < high")
    return (lo, hi)
