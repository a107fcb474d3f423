"""The standard hook points (TransformerLens names) and their shapes, described once.

Backends call :func:`standard_shape` from their ``hook_shape`` and add only their own
points. A name here is "known" to :meth:`HookPoint.parse`; any other name is a custom
point, kept verbatim, unless a plugin declares it (``mi_declare_hook_points``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mi_core.hooks import HookPoint

#: Global (non-layer) points.
GLOBAL_NAMES = ("hook_embed", "hook_pos_embed", "ln_final.hook_scale",
                "ln_final.hook_normalized")

#: Per-layer suffixes (``blocks.{i}.<suffix>``), grouped by shape.
_RESID = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out",
          "hook_mlp_out", "ln1.hook_normalized", "ln2.hook_normalized", "attn.hook_in",
          "mlp.hook_in", "hook_mlp_in")
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


def standard_shape(point: "HookPoint | str", batch: int, seq: int, *, d_model: int,
                   n_heads: int | None = None, n_kv_heads: int | None = None,
                   d_head: int | None = None, d_mlp: int | None = None,
                   key_len: int = -1) -> tuple[int, ...] | None:
    """Shape of the activation at a standard point for ids [batch, seq]; None for any other.

    `key_len`: length of the key axis of scores / pattern (-1: any, e.g. with a KV cache).
    A dimension the caller does not give (None) is -1, "any".
    """
    from mi_core.hooks import HookPoint

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
