"""The block structure RWKV-6 and RWKV-7 share, the recurrent state, and the backend.

Embedding -> [pre-LN at layer 0] -> per layer: LN -> time mix -> residual -> LN ->
channel mix -> residual -> final LN -> head. The version-specific pieces (token shift /
ddlerp, WKV recurrence, channel mix, weight names) live in ``v6.py`` / ``v7.py``; this file
never branches on the version.

State layout: ``wkv[layer]`` is [batch, heads, key_dim, value_dim] (the flash-linear-attention
convention), the WKV output is ``y_t = S_t^T r_t`` for v7 and ``r_t^T (S_{t-1} + diag(u) k_t v_t^T)``
for v6.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import (
    HookCache, HookPoint, HookRun, HookSpec, InterventionError, MIError, StateKnockoutSpec,
    StateSteeringSpec, WeightLoadError, standard_shape,
)
from mi_core.recurrence import write_scales

from mi_rwkv.config import RwkvConfig

#: Per-layer hook suffixes in execution order (names are built once per model).
LAYER_SUFFIXES = (
    "hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized", "attn.hook_in", "attn.hook_q",
    "attn.hook_k", "attn.hook_v",
    "rwkv.hook_decay", "rwkv.hook_effective_attn", "attn.hook_z", "rwkv.hook_state",
    "hook_attn_out", "hook_resid_mid", "ln2.hook_scale", "ln2.hook_normalized", "mlp.hook_in",
    "mlp.hook_pre", "mlp.hook_post",
    "hook_mlp_out", "hook_resid_post",
)


class LayerNames:
    """The hook names of one layer, as attributes (``names.resid_pre`` ...)."""

    def __init__(self, layer: int) -> None:
        for suffix in LAYER_SUFFIXES:
            attr = suffix.replace("hook_", "").replace(".", "_")
            setattr(self, attr, f"blocks.{layer}.{suffix}")


@attrs.define
class RwkvState:
    """The recurrent state carried between forward calls (the "cache" for generation).

    ``att_shift`` / ``ffn_shift``: [batch, hidden] per layer (the previous token's LN
    output, for token shift); ``wkv``: [batch, heads, key_dim, value_dim] per layer, F32;
    ``seen``: tokens consumed so far (state-intervention positions are absolute).
    """

    att_shift: list[torch.Tensor]
    wkv: list[torch.Tensor]
    ffn_shift: list[torch.Tensor]
    seen: int = 0

    @classmethod
    def zeros(cls, cfg: RwkvConfig, batch: int, device: torch.device,
              dtype: torch.dtype) -> "RwkvState":
        c, h, d = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        return cls(
            att_shift=[torch.zeros(batch, c, device=device, dtype=dtype) for _ in range(cfg.num_layers)],
            wkv=[torch.zeros(batch, h, d, d, device=device, dtype=torch.float32)
                 for _ in range(cfg.num_layers)],
            ffn_shift=[torch.zeros(batch, c, device=device, dtype=dtype) for _ in range(cfg.num_layers)],
        )

    def clone(self) -> "RwkvState":
        return RwkvState([t.clone() for t in self.att_shift], [t.clone() for t in self.wkv],
                         [t.clone() for t in self.ffn_shift], self.seen)


@attrs.define
class LayerCtx:
    """What a layer's time / channel mix needs besides its input."""

    layer: int
    run: HookRun
    names: LayerNames
    state: RwkvState
    #: [batch, seq] bool, False at padding (no state update there); None = all valid.
    active: torch.Tensor | None
    #: [seq, heads] write scale of the key-value outer product (state knockout / steering)
    #: or None (mi_core.recurrence.write_scales).
    write_scale: torch.Tensor | None
    #: RWKV-7 value residual: layer 0's value, [batch, seq, heads, head_dim].
    v_first: torch.Tensor | None = None
    chunk: int = 16


class RwkvLayer(Protocol):
    """A version's layer: the two mixes and the layer norms (weights as attributes)."""

    ln1: tuple[torch.Tensor, torch.Tensor]
    ln2: tuple[torch.Tensor, torch.Tensor]

    def time_mix(self, x: torch.Tensor, ctx: LayerCtx) -> torch.Tensor: ...

    def channel_mix(self, x: torch.Tensor, ctx: LayerCtx) -> torch.Tensor: ...


def token_shift(x: torch.Tensor, prev: torch.Tensor, active: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, T, C], prev [B, C] -> (previous valid token per position [B, T, C], new prev [B, C]).

    Padding positions (``active`` False) are skipped: a token's predecessor is the last
    valid token before it, or `prev` when there is none.
    """
    if active is None:
        return torch.cat([prev.unsqueeze(1), x[:, :-1]], dim=1), x[:, -1]
    b, t, _ = x.shape
    pos = torch.arange(t, device=x.device).expand(b, t)
    last = torch.where(active, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # [B, T]
    before = torch.cat([torch.full_like(last[:, :1], -1), last[:, :-1]], dim=1)
    gathered = x.gather(1, before.clamp(min=0).unsqueeze(-1).expand_as(x))
    shifted = torch.where((before >= 0).unsqueeze(-1), gathered, prev.unsqueeze(1))
    end = last[:, -1]
    new_prev = torch.where((end >= 0).unsqueeze(-1),
                           x.gather(1, end.clamp(min=0).view(b, 1, 1).expand(b, 1, x.shape[-1])).squeeze(1),
                           prev)
    return shifted, new_prev


def layer_norm(x: torch.Tensor, wb: tuple[torch.Tensor, torch.Tensor], eps: float,
               run: HookRun | None = None, scale_name: str = "", normalized_name: str = "",
               scale: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm over the last axis: ((x - mean) / scale) * weight + bias.

    Hooks, as TransformerLens: `scale_name` the divisor sqrt(var + eps) [..., 1],
    `normalized_name` ``(x - mean) / scale`` before the gain and bias (the output after
    them is the sublayer's ``hook_in``, applied by the caller). Only an intervention at one of
    them (or an explicit `scale`) changes the arithmetic; capturing changes no number.
    """
    if run is not None and scale_name and run.wants(scale_name):
        centred = x - x.mean(-1, keepdim=True)
        out = run.apply(scale_name, (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt())
        if run.spec.has_intervention_at(scale_name):
            scale = out
    want_norm = run is not None and bool(normalized_name) and run.wants(normalized_name)
    shape = (x.shape[-1],)
    if scale is None and not (want_norm and run.spec.has_intervention_at(normalized_name)):  # type: ignore[union-attr]
        if want_norm:  # capture only: the output keeps the fused arithmetic
            run.apply(normalized_name, F.layer_norm(x, shape, None, None, eps))  # type: ignore[union-attr]
        return F.layer_norm(x, shape, wb[0], wb[1], eps)
    if scale is None:
        n = F.layer_norm(x, shape, None, None, eps)
    else:
        n = (x - x.mean(-1, keepdim=True)) / scale.to(x.dtype)
    if want_norm:
        n = run.apply(normalized_name, n)  # type: ignore[union-attr]
    return n * wb[0] + wb[1]


class RwkvBackend:
    """An RWKV-6 or RWKV-7 model with hooks (the MIBackend protocol).

    Built by :func:`mi_rwkv.plugin.load_rwkv6` / ``load_rwkv7``; holds plain tensors.
    Capabilities (mi_core.capabilities): hook shapes, a recurrent state (``new_past``), state
    interventions, weight access, readout, layer types, context length (none: a recurrent
    model has no trained limit; its cache is the state) and gradients; no layer schedule.
    """

    differentiable = True

    def __init__(self, name: str, config: RwkvConfig, layers: Sequence[RwkvLayer],
                 embed: torch.Tensor, ln0: tuple[torch.Tensor, torch.Tensor],
                 ln_out: tuple[torch.Tensor, torch.Tensor], head: torch.Tensor,
                 device: torch.device, dtype: torch.dtype, chunk: int = 16) -> None:
        self.name = name
        self.config = config
        self.layers = list(layers)
        self.embed = embed
        self.ln0 = ln0
        self.ln_out = ln_out
        self.head = head
        self.device = device
        self.dtype = dtype
        self.chunk = chunk
        self.num_layers = config.num_layers
        self.layer_types = [f"rwkv{config.version}"] * config.num_layers  # LayerTypes
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_heads
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.max_positions: int | None = None
        self.context_length: int | None = None  # ContextLength: recurrent, no trained limit
        self.tokenizer: Any = None
        self._names = [LayerNames(i) for i in range(config.num_layers)]

    # -- hook metadata ------------------------------------------------------------------
    def hook_points(self) -> list[HookPoint]:
        pts = [HookPoint.parse("hook_embed")]
        for i in range(self.num_layers):
            pts += [HookPoint.parse(f"blocks.{i}.{s}") for s in LAYER_SUFFIXES]
        pts += [HookPoint.parse("ln_final.hook_scale"), HookPoint.parse("ln_final.hook_normalized")]
        return pts

    def hook_shape(self, point: HookPoint, batch: int, seq: int) -> tuple[int, ...] | None:
        """The core's standard shapes, plus RWKV's own points."""
        h, d = self.num_heads, self.config.head_dim
        s = HookPoint.parse(point).suffix
        own = {"rwkv.hook_decay": (batch, seq, h, d), "rwkv.hook_state": (batch, h, d, d),
               "rwkv.hook_effective_attn": (batch, h, seq, seq)}
        if s in own:
            return own[s]
        return standard_shape(point, batch, seq, d_model=self.hidden_size, n_heads=h,
                              n_kv_heads=h, d_head=d, d_mlp=self.config.intermediate_size)

    # -- state --------------------------------------------------------------------------
    def new_past(self, batch_size: int) -> RwkvState:
        """A zero recurrent state for `batch_size` sequences; forward(past=...) updates it in place."""
        return RwkvState.zeros(self.config, batch_size, self.device, self.dtype)

    def cache_bytes(self, batch: int, tokens: int) -> int:
        """ContextLength: the recurrent state, the same after any number of tokens."""
        c, h, d = self.hidden_size, self.num_heads, self.config.head_dim
        return self.num_layers * batch * (h * d * d * 4 + 2 * c * self.dtype.itemsize)

    # -- capabilities (mi_core.capabilities) -------------------------------------------
    def check_state_spec(self, spec: StateKnockoutSpec | StateSteeringSpec, seq: int | None,
                         call_len: int | None = None) -> None:
        """StateInterventions: layers and heads in range; without a carried state (`seq`
        given) the positions must lie in this call; with one they are absolute across calls."""
        spec.validate(self.num_layers, seq)
        bad = [h for h in spec.target_heads or [] if h >= self.num_heads]
        if bad:
            raise InterventionError(f"{type(spec).__name__}: heads {bad} out of range; the "
                                    f"RWKV layers have heads 0..{self.num_heads - 1}")
        t = seq if call_len is None else call_len
        for p in spec.positions:
            if t is not None and p < -t:
                raise InterventionError(f"{type(spec).__name__}: position {p} out of "
                                        f"range for a call of {t} tokens")

    # -- forward ------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, hooks: HookSpec, attention_mask: torch.Tensor | None = None,
                past: RwkvState | None = None, **kwargs: Any) -> HookCache:
        """ids [batch, seq] -> HookCache(logits [batch, seq, vocab]; extra["state"]).

        With `past`, the state is read from and written back to it (generation); the
        final state is also in ``cache.extra["state"]``.
        """
        if kwargs:
            raise MIError(f"{self.name}.forward: unexpected arguments {sorted(kwargs)}")
        b, t = ids.shape
        state = past if past is not None else self.new_past(b)
        if state.wkv[0].shape[0] != b:
            raise MIError(f"past holds {state.wkv[0].shape[0]} sequences, ids has {b}")
        active = None
        if attention_mask is not None:
            m = attention_mask[:, -t:].to(device=ids.device).bool()
            active = None if bool(m.all()) else m
        ko, st = hooks.state_knockout, hooks.state_steering
        for spec in (ko, st):
            if spec is not None:
                self.check_state_spec(spec, t if past is None else None, t)
        run = hooks.start()
        eps = self.config.norm_eps
        x = run.apply("hook_embed", self.embed[ids])
        x = layer_norm(x, self.ln0, eps)
        v_first: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            n = self._names[i]
            ctx = LayerCtx(layer=i, run=run, names=n, state=state, active=active,
                           write_scale=write_scales(ko, st, i, t, state.seen, self.num_heads,
                                                    ids.device),
                           v_first=v_first, chunk=self.chunk)
            x = run.apply(n.resid_pre, x)
            h = run.apply(n.attn_in, layer_norm(x, layer.ln1, eps, run, n.ln1_scale, n.ln1_normalized))
            x = run.apply(n.resid_mid, x + run.apply(n.attn_out, layer.time_mix(h, ctx)))
            v_first = ctx.v_first
            h = run.apply(n.mlp_in, layer_norm(x, layer.ln2, eps, run, n.ln2_scale, n.ln2_normalized))
            x = run.apply(n.resid_post, x + run.apply(n.mlp_out, layer.channel_mix(h, ctx)))
        x = layer_norm(x, self.ln_out, eps, run, "ln_final.hook_scale", "ln_final.hook_normalized")
        logits = x @ self.head.T
        state.seen += t
        return run.finish(logits, state=state)

    # -- pieces for analyses (logit lens, attribution) ---------------------------------
    def final_norm(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """The final LayerNorm of x [..., hidden]; `scale` [..., 1] replaces the divisor."""
        return layer_norm(x, self.ln_out, self.config.norm_eps, scale=scale)

    def unembed(self, normalized: torch.Tensor) -> torch.Tensor:
        """[..., hidden] (after the final LN) -> logits [..., vocab]."""
        return normalized @ self.head.T

    def project_to_vocab(self, hidden: torch.Tensor) -> torch.Tensor:
        """Residual vectors [..., hidden] -> logits [..., vocab] (final LN + head)."""
        return self.unembed(self.final_norm(hidden))

    def get_weight(self, name: str, layer: int | None = None) -> torch.Tensor:
        """Global weights in TransformerLens naming: W_E [vocab, hidden], W_U [hidden, vocab],
        ln_final.w / ln_final.b [hidden]. RWKV has no per-head Q/K/V/O matrices."""
        table = {"W_E": lambda: self.embed, "W_U": lambda: self.head.T,
                 "ln_final.w": lambda: self.ln_out[0], "ln_final.b": lambda: self.ln_out[1]}
        if name not in table:
            raise WeightLoadError(f"the {self.name} backend has no weight {name!r} "
                                  f"(available: {', '.join(table)})")
        return table[name]()


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ w[out, in]^T (nn.Linear layout)."""
    return x @ w.T
