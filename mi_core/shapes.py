"""The shapes of the standard hook points (TransformerLens names; the names are in
:mod:`mi_core.points`). Backends call :func:`standard_shape` from their ``hook_shape`` and
add only their own points."""

from __future__ import annotations

from mi_core.points import (  # noqa: F401  (the name tables are re-exported here)
    _KV_HEADS, _KV_INPUT, _MLP, _PATTERN, _Q_HEADS, _Q_INPUT, _RESID, _SCALE, GLOBAL_NAMES,
    LAYER_SUFFIXES, PRE_SOFTMAX_SCORES, HookPoint,
)


def standard_shape(point: "HookPoint | str", batch: int, seq: int, *, d_model: int,
                   n_heads: int | None = None, n_kv_heads: int | None = None,
                   d_head: int | None = None, d_mlp: int | None = None,
                   key_len: int = -1) -> tuple[int, ...] | None:
    """Shape of the activation at a standard point for ids [batch, seq]; None for any other.

    `key_len`: length of the key axis of scores / pattern (-1: any, e.g. with a KV cache).
    A dimension the caller does not give (None) is -1, "any".
    """
    hp = HookPoint.parse(point)
    s = hp.suffix
    if hp.layer is None:
        if s == "ln_final.hook_scale":
            return (batch, seq, 1)
        return (batch, seq, d_model) if s in GLOBAL_NAMES else None
    h = -1 if n_heads is None else n_heads
    kv = h if n_kv_heads is None else n_kv_heads
    dh = -1 if d_head is None else d_head
    if s in _RESID:
        return (batch, seq, d_model)
    if s in _SCALE:
        return (batch, seq, 1)
    if s in _Q_HEADS:
        return (batch, seq, h, dh)
    if s in _KV_HEADS:
        return (batch, seq, kv, dh)
    if s in _PATTERN:
        return (batch, h, seq, key_len)
    if s in _MLP:
        return (batch, seq, -1 if d_mlp is None else d_mlp)
    if s == "attn.hook_result" or s in _Q_INPUT:
        return (batch, seq, h, d_model)
    if s in _KV_INPUT:
        return (batch, seq, kv, d_model)
    return None
