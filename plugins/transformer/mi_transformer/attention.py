"""Grouped-query self-attention with RoPE (either layout, or none), masks (causal, sliding
window, chunked), soft-capping, attention sinks, latent projections (MLA,
:mod:`mi_transformer.mla`) and a KV cache.

Two paths, same numbers: the *explicit* path materialises scores and pattern (so they can be
captured or intervened on, and soft-capping or sinks applied); the *fast* path calls
``torch.nn.functional.scaled_dot_product_attention``. A layer takes the explicit path only
when a hook needs its scores/pattern, when it soft-caps or has sinks, or when forced.
"""

from __future__ import annotations

from typing import Callable

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import HookRun, MIError

from mi_transformer.config import Positions, RopeLayout, TransformerConfig
from mi_transformer.mla import MlaWeights, mla_qkv
from mi_transformer.norm import Norm
from mi_transformer.rope import apply_rope

NEG_INF = float("-inf")


@attrs.define(eq=False)
class AttnWeights:
    """Projections in torch.nn.Linear layout; fused checkpoints give row-views (no copy).
    With latent attention (`mla`) q, k and v come from the latent projections instead. A
    layer that shares an earlier layer's keys and values has neither `w_k` nor `w_v`; one
    whose values are its keys (Gemma-4's ``attention_k_eq_v``) has no `w_v`."""

    w_q: torch.Tensor | None  # [heads * d_head, d_model]; None with MLA
    w_k: torch.Tensor | None  # [kv_heads * d_head, d_model]; None: keys shared (or MLA)
    w_v: torch.Tensor | None  # [kv_heads * d_head, d_model]; None: shared, values = keys
    w_o: torch.Tensor  # [d_model, heads * d_head]
    b_q: torch.Tensor | None = None
    b_k: torch.Tensor | None = None
    b_v: torch.Tensor | None = None
    b_o: torch.Tensor | None = None
    q_norm: Norm | None = None  # per-head RMS norm of q/k before RoPE (Qwen3, Gemma 3)
    k_norm: Norm | None = None
    qk_norm_full: bool = False  # the q/k norms span all heads' dims at once (OLMo2, OLMoE)
    clip: float | None = None  # clamp q, k, v to [-clip, clip] after projection/norm (OLMo)
    w_gate: torch.Tensor | None = None  # [heads * d_head, d_model]: output gate (Qwen3-Next)
    b_gate: torch.Tensor | None = None
    sinks: torch.Tensor | None = None  # [heads] sink logits (gpt-oss)
    mla: MlaWeights | None = None  # latent projections (DeepSeek-V2/V3)
    #: low-rank adapters (A [rank, d_in], B [out, rank]) added to q, k, v: q = W_q x + B (A x)
    #: (Zamba2's shared block, one set per use; mi_transformer.shared_block)
    adapters: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None
    v_norm: Norm | None = None  # RMS norm of each head's values, no gain (Gemma-3n/4)


@attrs.define(eq=False)
class AttnNames:
    """Hook names of one layer's attention, built once at load."""

    q: str
    k: str
    v: str
    rot_q: str
    rot_k: str
    scores: str
    pattern: str
    z: str
    result: str
    q_scale: str
    k_scale: str
    gate: str = ""  # attn.hook_gate: sigmoid of the output gate [b, s, heads, d_head]
    sinks: str = ""
    q_latent: str = ""
    kv_latent: str = ""


class Masks:
    """Attention masks for one forward call, built once per distinct window / chunk.

    Key slot j is visible from query slot i (absolute cache slots) when j <= i, key j is not
    padding, pos(i) - pos(j) < window (sliding window) and pos(i) // chunk == pos(j) // chunk
    (chunked attention), with positions counted over real tokens only (so a right-padded row
    generating after its pads still sees exactly `window` real tokens). The diagonal is
    always visible, so padded query rows stay finite (never read at real positions).
    """

    def __init__(self, key_valid: torch.Tensor | None, offset: int, seq: int,
                 device: torch.device, key_positions: torch.Tensor | None = None) -> None:
        self.key_valid = key_valid  # [batch, offset + seq] bool, or None (no padding)
        self.key_positions = key_positions  # [batch, offset + seq]; None: positions == slots
        self.offset, self.seq, self.device = offset, seq, device
        self._bool: dict[tuple[int | None, int | None], torch.Tensor | None] = {}
        self._add: dict[tuple[int | None, int | None, torch.dtype], torch.Tensor] = {}
        self._temps: dict[tuple[float, float], torch.Tensor] = {}
        self._new: list[torch.Tensor | None] = []

    def new_valid(self) -> torch.Tensor | None:
        """[batch, seq] bool: which of this call's tokens are real; None when all are (a
        recurrent mixer then takes its path without padding). One check per call."""
        if not self._new:
            new = None if self.key_valid is None else self.key_valid[:, self.offset:]
            self._new.append(None if new is None or bool(new.all()) else new)
        return self._new[0]

    def to(self, device: torch.device) -> "Masks":
        """The same masks built on `device` (a placed model's blocks on another device)."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Masks(move(self.key_valid), self.offset, self.seq, device,
                     move(self.key_positions))

    def allowed(self, window: int | None, chunk: int | None = None) -> torch.Tensor:
        """bool [batch or 1, 1, seq, offset + seq]."""
        q = torch.arange(self.offset, self.offset + self.seq, device=self.device)[:, None]
        k = torch.arange(self.offset + self.seq, device=self.device)[None, :]
        ok = (k <= q)[None, None]
        kp = self.key_positions
        if window is not None:
            if kp is None:
                ok = ok & (k > q - window)[None, None]
            else:
                qp = kp[:, self.offset:]
                ok = ok & ((qp[:, :, None] - kp[:, None, :]) < window)[:, None]
        if chunk is not None:
            if kp is None:
                ok = ok & (k // chunk == q // chunk)[None, None]
            else:
                qp = kp[:, self.offset:]
                ok = ok & (qp[:, :, None] // chunk == kp[:, None, :] // chunk)[:, None]
        if self.key_valid is not None:
            ok = (ok & self.key_valid[:, None, None, :]) | (k == q)[None, None]
        return ok

    def sdpa_mask(self, window: int | None, chunk: int | None = None) -> torch.Tensor | None:
        """bool mask for SDPA, or None when `is_causal` (offset 0) / no mask (1 query) suffices."""
        key = (window, chunk)
        if key not in self._bool:
            top = self.offset + self.seq
            trivial = self.key_valid is None and (window is None or top <= window) and (
                chunk is None or top <= chunk) and (self.offset == 0 or self.seq == 1)
            self._bool[key] = None if trivial else self.allowed(window, chunk)
        return self._bool[key]

    def additive(self, window: int | None, dtype: torch.dtype, chunk: int | None = None
                 ) -> torch.Tensor:
        """0 / -inf float mask [batch or 1, 1, seq, offset + seq] for the explicit path."""
        key = (window, chunk, dtype)
        if key not in self._add:
            zero = torch.zeros((), dtype=dtype, device=self.device)
            self._add[key] = torch.where(self.allowed(window, chunk), zero,
                                         torch.full((), NEG_INF, dtype=dtype, device=self.device))
        return self._add[key]

    def temperature(self, floor: float, scale: float) -> torch.Tensor:
        """Llama 4's query scale on layers without RoPE: log1p(floor((pos + 1) / floor)) *
        scale + 1 per query, [batch or 1, 1, seq, 1] float32, pos each query's position (real
        tokens counted, as RoPE's)."""
        key = (floor, scale)
        if key not in self._temps:
            if self.key_positions is None:
                pos = torch.arange(self.offset, self.offset + self.seq, device=self.device)[None]
            else:
                pos = self.key_positions[:, self.offset:]
            t = torch.log1p(torch.floor((pos.float() + 1.0) / floor)) * scale + 1.0
            self._temps[key] = t[:, None, :, None]
        return self._temps[key]


def safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim, in float32 as transformers' eager attention does; a row that
    is all -inf gives zeros, not NaN."""
    p = torch.softmax(scores, dim=-1, dtype=torch.float32)
    # in place unless autograd needs the softmax output for its backward
    return (p.nan_to_num(0.0) if p.requires_grad else p.nan_to_num_(0.0)).to(scores.dtype)


@attrs.frozen
class LayerSettings:
    """Everything attention needs to know about one layer, built once from the config
    (:meth:`of`), so the forward passes one object instead of a dozen scalars."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float  # multiplies q.k
    softcap: float | None = None  # cap * tanh(scores / cap) (forces the explicit path)
    window: int | None = None  # sliding window (None = full causal)
    rope: int | None = 0  # index of the layer's (cos, sin) table; None = no rotary
    interleaved: bool = False  # GPT-J rotary layout (pairs of adjacent dims)
    qk_norm_after_rope: bool = False  # q/k norms on the rotated q/k (Hunyuan, Llama 4)
    chunk: int | None = None  # chunked local attention (Llama 4)
    rope_tail: int = 0  # rotate the trailing dims of each head, not the leading ones (MLA)
    temperature: tuple[float, float] | None = None  # Llama 4's query scale (NoPE layers)
    shared_kv: bool = False  # keys / values are an earlier layer's (Gemma-3n/4)
    key_scale: float = 1.0  # keys times this after their projection (Falcon-H1)

    @classmethod
    def of(cls, c: TransformerConfig, i: int) -> "LayerSettings":
        scale = c.attn_scale / (i + 1) if c.attn_scale_by_layer else c.attn_scale
        rope = c.layer_rope[i] if c.positions is Positions.ROPE and (
            not c.layer_use_rope or c.layer_use_rope[i]) else None  # NoPE layers
        return cls(num_heads=c.num_heads, num_kv_heads=c.kv_heads_of(i), head_dim=c.head_dim_of(i),
                   scale=scale, softcap=c.attn_softcap, window=c.layer_windows[i], rope=rope,
                   interleaved=c.rope_layout is RopeLayout.INTERLEAVED,
                   qk_norm_after_rope=c.qk_norm_after_rope,
                   chunk=c.layer_chunks[i] if c.layer_chunks else None,
                   rope_tail=c.mla.rope_dim if c.mla is not None else 0,
                   temperature=c.attn_temperature if rope is None else None,
                   shared_kv=c.shares_kv(i), key_scale=c.key_scale)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """GPT-J's rotate_every_two: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                           ) -> torch.Tensor:
    """x [batch, heads, seq, d_head]; cos/sin [.., rot] with each frequency repeated twice
    (``repeat_interleave``); the first `rot` dims rotate in adjacent pairs."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + _rotate_pairs(x) * sin
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat((xr * cos + _rotate_pairs(xr) * sin, xp), dim=-1)


def _rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, ls: LayerSettings,
            run: HookRun, name: str, norm: Norm | None = None, scale_name: str = ""
            ) -> torch.Tensor:
    """x [b, s, n, d_head] -> rotated [b, n, s, d_head], computed in that (contiguous) layout
    so SDPA reads contiguous inputs; the hook sees the documented [b, s, n, d_head] view.
    Without rotary (learned positions) ``hook_rot_*`` equals ``hook_q`` / ``hook_k``.
    `ls.rope_tail`: only the trailing dims rotate (MLA's rope part). `norm`: a q/k norm
    applied after the rotation (Hunyuan, Llama 4), before ``hook_rot_*``."""
    xt = x.transpose(1, 2)
    if rope is not None:
        f = apply_rope_interleaved if ls.interleaved else apply_rope
        # float32 tables (rope_float32) rotate a half-precision q / k in float32
        rotate = f if rope[0].dtype == xt.dtype else (
            lambda t, cos, sin: f(t.float(), cos, sin).to(t.dtype))
        if ls.rope_tail:
            xt = torch.cat((xt[..., :-ls.rope_tail], rotate(xt[..., -ls.rope_tail:], *rope)),
                           dim=-1)
        else:
            xt = rotate(xt, *rope)
    if norm is not None and not run.wants(scale_name):
        xt = norm(xt)  # over d_head: the contiguous [b, n, s, d] layout gives the same numbers
    y = xt.transpose(1, 2)
    if norm is not None and run.wants(scale_name):
        y = norm(y, run, scale_name)  # its scale hook sees the documented [b, s, n, 1]
    return run.apply(name, y).transpose(1, 2)


def _per_head(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, n: int,
              head_dim: int) -> torch.Tensor:
    """x [b, s, n, d_model], weight [n * d_head, d_model] -> [b, s, n, d_head], head h reading
    only its own input row."""
    out = torch.einsum("bsnm,ndm->bsnd", x, weight.view(n, head_dim, -1))
    return out + bias.view(n, head_dim) if bias is not None else out


def attention(w: AttnWeights, x: torch.Tensor,
              rope: tuple[torch.Tensor, torch.Tensor] | None, masks: Masks, run: HookRun,
              n: AttnNames, ls: LayerSettings, *, explicit: bool | None,
              cache_update: Callable[[torch.Tensor, torch.Tensor],
                                     tuple[torch.Tensor, torch.Tensor]] | None = None,
              head_inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
              shared: tuple[torch.Tensor, torch.Tensor] | None = None,
              keep: Callable[[torch.Tensor, torch.Tensor], None] | None = None
              ) -> torch.Tensor:
    """x [batch, seq, d_model] (already normalised) -> attention output [batch, seq, d_model].

    `rope`: this layer's (cos, sin) [batch, 1, seq, rot] (None: no rotary); `ls` the layer's
    settings. `explicit`: True/False forces a path, None picks (explicit iff scores/pattern
    are hooked); a soft-capping layer is always explicit. `cache_update(k, v)` appends this
    call's rotated keys and values [batch, kv_heads, seq, d_head] to the cache and returns
    the full ones. `head_inputs`: normalised per-head inputs of q, k and v ([batch, seq,
    heads or kv_heads, d_model], from ``hook_q_input`` / ``hook_k_input`` /
    ``hook_v_input``) used instead of x. `shared`: the rotated keys and values [batch,
    kv_heads, cached + seq, d_head] of the earlier layer whose keys this layer shares (it
    computes only queries: no k / v points); `keep(k, v)` receives this layer's full keys and
    values (after the cache) for the layers that share them.
    """
    if w.mla is not None:  # latent attention: q, k, v per head from the latents
        q, k, v = mla_qkv(w.mla, x, ls.num_heads, run, n.q_latent, n.kv_latent)
        num_kv_heads = ls.num_kv_heads
    else:
        q, k, v, num_kv_heads = _qkv(w, x, ls, run, n, head_inputs, not ls.qk_norm_after_rope)
    q = run.apply(n.q, q)  # [b, s, heads, d_head], before RoPE
    if k is not None:
        if ls.key_scale != 1.0:  # Falcon-H1's key_multiplier (before RoPE, as transformers)
            k = k * ls.key_scale
        k = run.apply(n.k, k)
        v = run.apply(n.v, v)
    if ls.qk_norm_after_rope:  # Hunyuan, Llama 4: the q/k norms read the rotated q / k
        q = _rotate(q, rope, ls, run, n.rot_q, w.q_norm, n.q_scale)
        if k is not None:
            k = _rotate(k, rope, ls, run, n.rot_k, w.k_norm, n.k_scale)
    else:
        q = _rotate(q, rope, ls, run, n.rot_q)
        if k is not None:
            k = _rotate(k, rope, ls, run, n.rot_k)
    if ls.temperature is not None:  # Llama 4's NoPE layers: queries scaled by position
        q = (q * masks.temperature(*ls.temperature)).to(q.dtype)
    if k is None:  # keys and values of an earlier layer (already rotated and cached)
        if shared is None:
            raise MIError("a layer that shares keys and values ran before the layer whose "
                          "keys it reads (layer_schedule)")
        k, v = shared  # (per query head when the source layer's hook_attn_in was edited)
        num_kv_heads = k.shape[1]
    else:
        v = v.transpose(1, 2)  # [b, g, s, d_head]
        if cache_update is not None:
            k, v = cache_update(k, v)
    if keep is not None:
        keep(k, v)
    # a copy where a hook sees them: an in-place edit must not rewrite the weights
    sinks = None if w.sinks is None else run.apply(
        n.sinks, w.sinks.clone() if run.wants(n.sinks) else w.sinks)
    if ls.softcap is not None or sinks is not None:
        explicit = True  # SDPA cannot soft-cap or add sinks: explicit even when "sdpa" is forced
    elif explicit is None:
        explicit = run.wants(n.scores) or run.wants(n.pattern)
    if explicit:
        z = _explicit(q, k, v, masks, run, n, ls, num_kv_heads, sinks)
    else:
        z = _sdpa(q, k, v, masks, ls, num_kv_heads)
    z = run.apply(n.z, z.transpose(1, 2))  # [b, s, heads, d_head]
    if w.w_gate is not None:  # output gate: W_O reads z * sigmoid(gate) (hook_z is before it)
        src = x if head_inputs is None else head_inputs[0]
        gate = _per_head(src, w.w_gate, w.b_gate, ls.num_heads, ls.head_dim) \
            if head_inputs is not None else F.linear(x, w.w_gate, w.b_gate).view(z.shape)
        z = z * run.apply(n.gate, torch.sigmoid(gate))
    return _output(w, z, run, n, ls)


def _qkv(w: AttnWeights, x: torch.Tensor, ls: LayerSettings, run: HookRun, n: AttnNames,
         head_inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
         qk_norms: bool = True
         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]:
    """Projections of x [b, s, d_model] (or of per-head inputs), q/k norms, clipping and the
    value norm -> q [b, s, heads, d_head], k, v [b, s, kv, d_head] (None for a layer that
    shares an earlier layer's) and kv, the number of key/value heads (all heads when
    per-query-head inputs of k and v are given)."""
    num_heads, num_kv_heads, head_dim = ls.num_heads, ls.num_kv_heads, ls.head_dim
    b, s, _ = x.shape
    if w.w_k is None:  # the keys and values are an earlier layer's: queries only
        q = F.linear(x, w.w_q, w.b_q).view(b, s, num_heads, head_dim)
        if qk_norms and w.q_norm is not None:
            q = w.q_norm(q, run, n.q_scale)
        return q, None, None, num_kv_heads
    if head_inputs is None:
        q = F.linear(x, w.w_q, w.b_q)
        k = F.linear(x, w.w_k, w.b_k)
        # values = the key projection before its norm (Gemma-4's attention_k_eq_v)
        v = F.linear(x, w.w_v, w.b_v) if w.w_v is not None else k
        if w.adapters is not None:  # as transformers: the projection, plus B (A x) (Zamba2)
            q, k, v = (t + F.linear(F.linear(x, a), bb) for t, (a, bb) in zip((q, k, v),
                                                                           w.adapters))
        q = q.view(b, s, num_heads, head_dim)
        k = k.view(b, s, num_kv_heads, head_dim)
        v = v.view(b, s, num_kv_heads, head_dim)
    else:
        if head_inputs[1].shape[2] != num_kv_heads:  # per query head keys/values (hook_attn_in)
            groups = num_heads // num_kv_heads
            rep = lambda t: None if t is None else t.reshape(  # noqa: E731  per KV head -> query
                num_kv_heads, -1).repeat_interleave(groups, 0).reshape(-1, *t.shape[1:])
            w = attrs.evolve(w, **{n_: rep(t) for n_, t in (
                ("w_k", w.w_k), ("w_v", w.w_v), ("b_k", w.b_k), ("b_v", w.b_v))})
            kn = w.k_norm
            if kn is not None and (w.qk_norm_full or kn.weight.dim() == 2):  # gains per KV head
                # (the RMS over heads repeated alike is theirs: only the gains are repeated)
                w = attrs.evolve(w, k_norm=attrs.evolve(kn, weight=rep(kn.weight),
                                                        bias=rep(kn.bias), gain=None))
            num_kv_heads = num_heads
        q, k, v = (_per_head(xi, wi, bi, n_i, head_dim) for xi, wi, bi, n_i in zip(
            head_inputs, (w.w_q, w.w_k, w.w_v), (w.b_q, w.b_k, w.b_v),
            (num_heads, num_kv_heads, num_kv_heads)))
    if qk_norms and w.q_norm is not None and w.k_norm is not None:
        if w.qk_norm_full:  # one norm over [heads * d_head]; hook_scale [b, s, 1]
            q = w.q_norm(q.flatten(2), run, n.q_scale).view(q.shape)
            k = w.k_norm(k.flatten(2), run, n.k_scale).view(k.shape)
        else:
            q = w.q_norm(q, run, n.q_scale)
            k = w.k_norm(k, run, n.k_scale)
    if w.clip is not None:
        q, k, v = (t.clamp(-w.clip, w.clip) for t in (q, k, v))
    if w.v_norm is not None:
        v = w.v_norm(v)
    return q, k, v, num_kv_heads


def _explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: Masks, run: HookRun,
              n: AttnNames, ls: LayerSettings, num_kv_heads: int,
              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [b, heads, s_q, d_head], k / v [b, kv, s_k, d_head] -> z [b, heads, s_q, d_head],
    with scores and pattern [b, heads, s_q, s_k] materialised (hooked, soft-capped). `sinks`
    [heads]: each head's sink logit joins the softmax of every row as one more key that has
    no value; the pattern holds the real keys only (rows sum to 1 - the sink's share)."""
    num_heads, head_dim, softcap = ls.num_heads, ls.head_dim, ls.softcap
    b, _, s, _ = q.shape
    groups = num_heads // num_kv_heads
    # GQA without copying K/V: the `groups` query heads that share a KV head are stacked
    # along the query axis ([b, g_kv, groups * s_q, d]), so one matmul per KV head serves
    # them all and the result views back to [b, h, s_q, s_k] (heads are grouped contiguously).
    s_k = k.shape[2]
    if groups > 1:
        # transformers' repeat_kv copies K / V into contiguous tensors; a strided K (our
        # transposed view) takes another CPU float16 matmul kernel that rounds differently
        k, v = k.contiguous(), v.contiguous()
    scores = torch.matmul(q.reshape(b, num_kv_heads, groups * s, head_dim),
                          k.transpose(-1, -2)).view(b, num_heads, s, s_k)
    scores.mul_(ls.scale)  # in place: `scores` is fresh; same ops and order as transformers
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = run.apply(n.scores, scores.add_(masks.additive(ls.window, scores.dtype, ls.chunk)))
    if sinks is None:
        pattern = safe_softmax(scores)
    else:  # as transformers' gpt-oss: softmax over [scores | sink], the sink column dropped
        col = sinks.to(scores.dtype).view(1, num_heads, 1, 1).expand(b, -1, s, 1)
        pattern = safe_softmax(torch.cat([scores, col], dim=-1))[..., :-1]
    pattern = run.apply(n.pattern, pattern)
    return torch.matmul(pattern.reshape(b, num_kv_heads, groups * s, s_k), v
                        ).view(b, num_heads, s, v.shape[-1])


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: Masks, ls: LayerSettings,
          num_kv_heads: int) -> torch.Tensor:
    """The same as :func:`_explicit` with the fused kernels of
    ``scaled_dot_product_attention`` (nothing materialised, no soft-capping)."""
    groups = ls.num_heads // num_kv_heads
    mask = masks.sdpa_mask(ls.window, ls.chunk)
    if groups > 1 and mask is not None:
        # SDPA's native GQA with a mask falls back to the slow math kernel (as transformers
        # notes); repeating the KV heads keeps the fused kernels.
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=ls.scale, enable_gqa=groups > 1 and mask is None,
        is_causal=mask is None and q.shape[2] > 1 and q.shape[2] == k.shape[2])


def _output(w: AttnWeights, z: torch.Tensor, run: HookRun, n: AttnNames, ls: LayerSettings
            ) -> torch.Tensor:
    """z [b, s, heads, d_head] -> the output projection [b, s, d_model]; through the per-head
    results [b, s, heads, d_model] only when ``hook_result`` is wanted."""
    num_heads, head_dim = ls.num_heads, z.shape[-1]  # the values' width (MLA: v_head_dim)
    b, s = z.shape[0], z.shape[1]
    if run.wants(n.result):
        w_o = w.w_o.view(-1, num_heads, head_dim)  # [d_model, heads, d_head]
        result = run.apply(n.result, torch.einsum("bshd,mhd->bshm", z, w_o))
        out = result.sum(dim=2)
        return out + w.b_o if w.b_o is not None else out
    return F.linear(z.reshape(b, s, num_heads * head_dim), w.w_o, w.b_o)
