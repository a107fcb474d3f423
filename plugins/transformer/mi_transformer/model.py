"""The one generic decoder-only forward pass, config-driven, with every hook point.

Reading order: :class:`TransformerBackend.forward` (embed -> blocks -> final norm -> logits),
then :meth:`TransformerBackend._block` (sequential or parallel attention and MLP, optional
post-norms), then the helpers; the per-layer records (hook names, KV cache) come last.
Nothing here checks a family name; every difference is an axis of :class:`TransformerConfig`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Sequence

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import (
    HookCache, HookPoint, HookRun, HookSpec, InputError, MIError, MITokenizer, WeightLoadError,
    standard_shape,
)

from mi_transformer import altup, per_layer
from mi_transformer.attention import LayerSettings, Masks, attention
from mi_transformer.config import (BlockLayout, Positions, RopeConfig, RopeLayout,
                                   TransformerConfig)
from mi_transformer.mixers import (check_state_spec, mixer_block, mixer_branch,
                                   mixer_hook_shape, mixer_layer_points, parallel_layer_points)
from mi_transformer.mlp import ACTIVATIONS, mlp
from mi_transformer.moe import MoeNames, moe
from mi_transformer.names import LayerNames
from mi_transformer.placement import Layout
from mi_transformer.processing import process_weights
from mi_transformer.rope import attention_scaling, cos_sin, inv_freq
from mi_transformer.shared_block import SharedNames
from mi_transformer.weights import LayerWeights, Weights

BetweenLayers = Callable[[int, int, torch.Tensor], torch.Tensor]
#: get_weight names an attention layer / an MLP has (a mixer's layer may have neither)
_ATTN_WEIGHTS = frozenset({"W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"})
_MLP_WEIGHTS = frozenset({"W_in", "b_in", "W_gate", "W_up", "b_up", "W_out", "b_out", "ln2.w",
                          "ln2.b"})


class TransformerBackend:
    """A loaded decoder-only transformer (the MIBackend the ``transformer`` plugin returns)."""

    name = "transformer"
    #: Capabilities (mi_core.capabilities): hook shapes, KV-cached generation, layer
    #: schedules, weight access, readout, layer types, context length and gradients.
    differentiable = True

    def __init__(self, config: TransformerConfig, weights: Weights, device: torch.device,
                 dtype: torch.dtype, tokenizer: MITokenizer | None = None, *,
                 layout: Layout | None = None) -> None:
        self.config = config
        self.w = weights
        self.device, self.dtype = device, dtype  # device: the embedding's (inputs, logits)
        #: each part's device (mi_transformer.placement); one device unless placed
        self.layout = layout if layout is not None else Layout.single(device, config.num_layers)
        self.tokenizer = tokenizer
        self.num_layers = config.num_layers
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.d_head = config.head_dim
        self.d_mlp = config.intermediate_size
        self.max_positions = config.max_positions
        self.context_length = config.max_positions  # ContextLength: max_position_embeddings
        self.act = ACTIVATIONS[config.activation]
        self.names = [LayerNames.of(i) for i in range(config.num_layers)]
        for i, n in enumerate(self.names):
            if config.moe is not None and config.layer_moe and config.layer_moe[i]:
                n.moe = MoeNames.of(i, config.moe.num_experts)
            n.rotary = config.positions is Positions.ROPE and (
                not config.layer_use_rope or config.layer_use_rope[i])
            n.qk_norm = config.qk_norm and (not config.layer_qk_norm or config.layer_qk_norm[i])
            n.has_mlp = config.has_mlp(i)
            n.has_kv = not config.shares_kv(i)  # a layer sharing keys has no k / v points
            # per-head inputs need the layer's own k and v projections of ln1's output
            n.head_inputs = config.mla is None and n.has_kv and not config.k_eq_v_of(i)
            n.moe_beside = n.moe is not None and config.moe is not None and \
                config.moe.beside_mlp
            n.laurel = config.laurel_rank > 0
            n.ple = config.per_layer_input is not None
            n.altup = config.altup is not None
        #: ResidualTerms (mi_core.capabilities): why the final residual is not the embedding
        #: plus the layers' attention / MLP outputs ("" when it is), for the decompositions
        self.residual_not_a_sum = config.residual_not_a_sum()
        #: HeadTerms: why per-head results do not sum to hook_attn_out ("" when they do)
        self.heads_not_a_sum = config.heads_not_a_sum()
        #: layers whose keys and values later layers read (kept for them during a forward)
        self._kv_sources = {config.kv_source_of(i) for i in range(config.num_layers)
                            if config.shares_kv(i)}
        self.settings = [LayerSettings.of(config, i) for i in range(config.num_layers)]
        #: each layer's residual scales (alpha / beta per sublayer, MiniMax), None: all 1
        self.scales = [config.residual_scales(i) for i in range(config.num_layers)]
        self.shared_names = [SharedNames.of(i) for i in range(config.num_layers)]  # (Zamba2)
        #: each layer's mixer (the LayerTypes capability): attention, or a plugin's mixer
        self.layer_types = [
            ("shared_attention+" if config.shared_set(i) is not None else "") + mc.name
            if (mc := config.mixer_of(i)) is not None and not config.is_parallel(i)
            # a layer without a mixer: "mlp", or "moe" (Nemotron-H's names)
            else ("moe" if config.layer_moe and config.layer_moe[i] else "mlp")
            if not config.has_attention(i)
            else ("sliding_attention" if s.window is not None
                  else "chunked_attention" if s.chunk is not None else "full_attention")
            + (f"+{mc.name}" if mc is not None else "")  # attention beside a mixer
            for i, s in enumerate(self.settings)]
        for i, lw in enumerate(weights.layers):
            if lw.mixer is not None:
                self.names[i].mixer_in = f"blocks.{i}.{lw.mixer.input_point}"
                self.names[i].mixer_out = f"blocks.{i}.hook_mixer_out"
        if any(lw.mixer is not None for lw in weights.layers):
            # StateInterventions: declared only by models with recurrent layers (an
            # attention-only model refuses state specs with a CapabilityError)
            self.check_state_spec = functools.partial(check_state_spec, self)
        self.inv_freqs = [inv_freq(r, config.rope_dim_of(r)).to(device) for r in config.ropes]
        self._warned_long = False

    # -- forward -----------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, hooks: HookSpec | None = None,
                attention_mask: torch.Tensor | None = None, past: KVCache | None = None,
                layer_schedule: Sequence[int] | None = None,
                between_layers: BetweenLayers | None = None,
                attn_impl: str | None = None, **unknown: Any) -> HookCache:
        """ids [batch, seq] -> HookCache with logits [batch, seq, vocab].

        attention_mask: [batch, seq] (or [batch, cached + seq] with `past`), 1 = real token;
        positions are its cumulative sum, so left/right padding give each row the positions
        it would have alone. past: a :meth:`new_past` cache, extended in place.
        layer_schedule: layer indices to run in order (repeats allowed; default all once).
        between_layers(step, layer, resid) -> resid: called after each scheduled layer.
        attn_impl: "explicit" / "sdpa" forces an attention path (default: automatic).
        """
        if unknown:
            raise MIError(f"unknown forward option(s) {sorted(unknown)}; the transformer backend "
                          f"takes attention_mask, past, layer_schedule, between_layers, attn_impl")
        if attn_impl not in (None, "explicit", "sdpa"):
            raise MIError(f"attn_impl must be None, 'explicit' or 'sdpa', got {attn_impl!r}")
        c, w = self.config, self.w
        run = (hooks if hooks is not None else HookSpec()).start()
        batch, seq = ids.shape
        schedule = tuple(range(c.num_layers)) if layer_schedule is None else tuple(layer_schedule)
        self._check_schedule(schedule, past)
        offset = past.length if past is not None else 0
        key_positions, key_valid = self._positions(batch, seq, offset, attention_mask, past)
        positions = key_positions[:, offset:]
        masks = Masks(key_valid, offset, seq, ids.device,
                      key_positions if key_valid is not None else None)
        rope = self._rope_tables(positions)
        explicit = {None: None, "explicit": True, "sdpa": False}[attn_impl]
        placed = self.layout.placed
        on = {ids.device: (rope, masks)}  # per device: rotary tables and masks

        x = self._embed(ids, positions, run)
        emb = {x.device: x} if c.shared_block is not None else None  # (Zamba2's block reads it)
        # per-layer input embeddings [b, s, L, p] (Gemma-3n / Gemma-4), from the ids and the
        # scaled token embedding (hook_embed, as intervened on)
        ple = per_layer.per_layer_inputs(w.per_layer, c, ids, x) \
            if w.per_layer is not None else None
        streams = altup.streams_in(x, w.altup_in) if c.altup is not None else None
        kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # keys other layers share
        hooked = not run.spec.is_empty()
        for step, layer in enumerate(schedule):
            dev = self.layout.layers[layer]
            if placed and x.device != dev:
                x = x.to(dev)  # the block's device (autograd follows)
                streams = streams.to(dev) if streams is not None else None
                ple = ple.to(dev) if ple is not None else None
            if x.device not in on:
                on[x.device] = ([(c_.to(x.device), s_.to(x.device)) for c_, s_ in rope],
                                masks.to(x.device))
            r_tables, r_masks = on[x.device]
            if w.layers[layer].attn is None:  # a plugin's mixer or no mixer (mixers.py)
                x = mixer_block(self, layer, x, run, past, step, r_masks,
                                self._shared_input(layer, x.device, emb, r_tables, explicit))
            else:
                ctx = self._layer_call(layer, step, past, kv, r_tables, r_masks, explicit, ple)
                if streams is not None:
                    streams = altup.altup_block(self, layer, streams, run, ctx)
                    x = streams[c.altup.active]
                else:
                    x = self._block(layer, x, run, ctx)
            if between_layers is not None:  # a copy: an edit in place must not reach captures
                x = between_layers(step, layer, x.clone() if hooked else x)
                if streams is not None:  # the active stream, written back into the stack
                    streams = altup.with_stream(streams, c.altup.active, x)
        if streams is not None:  # AltUp's readout: the streams' average
            x = run.apply("altup.hook_out", altup.streams_out(
                streams.to(self.layout.unembed) if placed else streams, w.altup_out))
        x = w.final_norm(x.to(self.layout.unembed) if placed else x, run, "ln_final.hook_scale",
                         "ln_final.hook_normalized")
        logits = self.unembed(x)
        if past is not None:
            past.length += seq
        # logits come back where the ids went in (accelerate's io_same_device)
        return run.finish(logits.to(ids.device) if placed else logits, past=past)

    def _shared_input(self, layer: int, device: torch.device,
                      emb: dict[torch.device, torch.Tensor] | None,
                      tables: list[tuple[torch.Tensor, torch.Tensor]], explicit: bool | None
                      ) -> tuple[torch.Tensor, Any, bool | None] | None:
        """What a layer that runs a shared attention block before its mixer (Zamba2) needs:
        the embeddings on `device`, its rotary table and the attention path; None otherwise."""
        if emb is None or self.w.layers[layer].shared is None:
            return None
        e = emb.setdefault(device, next(iter(emb.values())).to(device))
        r = self.settings[layer].rope
        return e, tables[r] if r is not None else None, explicit

    def _block(self, i: int, x: torch.Tensor, run: HookRun, ctx: "_LayerCall") -> torch.Tensor:
        """One block, x [batch, seq, d_model] -> [batch, seq, d_model]: the sublayers
        (:meth:`_sublayers`), then, where the config has them, the per-layer-input branch
        added after the MLP and the layer's scalar multiplying the result (Gemma-4)."""
        lw, n = self.w.layers[i], self.names[i]
        x = run.apply(n.resid_pre, x)
        y = self._sublayers(i, x, run, ctx)
        if lw.ple is not None:
            y = y + per_layer.branch(lw.ple, y, ctx.ple, i, self.act, run, n.ple_in, n.ple_out)
        if lw.scalar is not None:
            y = y * lw.scalar
        return run.apply(n.resid_post, y)

    def _sublayers(self, i: int, x: torch.Tensor, run: HookRun, ctx: "_LayerCall"
                   ) -> torch.Tensor:
        """Attention and MLP on x [batch, seq, d_model] (the block's input after
        ``hook_resid_pre``) -> their result before ``hook_resid_post``.

        Sequential: x += attn(ln1(x)); x += mlp(ln2(x)). Parallel: x += attn(ln1(x)) +
        mlp(ln2(x)), both branches reading the block's input (ln2 is ln1 when the block
        shares one norm). Post-norms (Gemma 2/3) normalise each branch's output. With Laurel
        (Gemma-3n) the residual after attention is (x + attn_out + laurel(ln1(x))) / sqrt 2.
        A layer with a mixer beside attention (``layer_parallel``, Falcon-H1): x += mixer(h)
        + attn(h) with h = ln1(x), the mixer run first (mixers.mixer_branch).
        """
        c, lw, n = self.config, self.w.layers[i], self.names[i]
        sequential = c.block is BlockLayout.SEQUENTIAL
        scaled = lw.mixer is not None or c.attn_in_scale != 1.0  # attn.hook_in after the norm
        heads = self._head_inputs(i, x, run)  # per-head inputs (their ln1 points fire there)
        if lw.ln1 is not None:
            ln = ("", "") if heads is not None else (n.ln1_scale, n.ln1_normalized)
            hn = lw.ln1(x, run, *ln, out_name="" if scaled else n.attn_in)
        else:  # no pre-norm (OLMo2): attention reads the residual stream itself
            hn = x if scaled else run.apply(n.attn_in, x)
        mixed = None if lw.mixer is None else mixer_branch(self, i, hn, run, ctx.past, ctx.step,
                                                           ctx.masks)
        h = hn
        if scaled:
            h = run.apply(n.attn_in, h * c.attn_in_scale if c.attn_in_scale != 1.0 else h)
        a = attention(lw.attn, h, ctx.rope, ctx.masks, run, n.attn, self.settings[i],
                      explicit=ctx.explicit, cache_update=ctx.cache_update,
                      head_inputs=heads, shared=ctx.shared,
                      keep=ctx.keep)
        if lw.ln1_post is not None:
            a = lw.ln1_post(a, run, n.ln1_post_scale, n.ln1_post_normalized)
        if c.attn_out_scale != 1.0:  # Falcon-H1's attention_out_multiplier
            a = a * c.attn_out_scale
        if c.residual_scale != 1.0:  # Granite: branch outputs scaled before the residual add
            a = a * c.residual_scale
        sc = self.scales[i]
        if sc is not None:  # MiniMax: residual * alpha + branch * beta
            a = a * sc[1]
        a = run.apply(n.attn_out, a)
        if mixed is not None:  # a mixer beside attention: both add, as their sum (Falcon-H1)
            a = mixed + a
        res = self._residual(i, x, hn, 0)  # MiniMax: the norm's output, times alpha
        if not n.has_mlp:  # an attention layer without an MLP (Nemotron-H)
            return res + a
        if lw.laurel is not None:  # Gemma-3n: Laurel beside attention, the sum over sqrt 2
            mid = altup.laurel_residual(x, a, run.apply(n.laurel_out, lw.laurel(h)))
            x = run.apply(n.resid_mid, mid)
        elif not sequential:
            return x + (a + self._mlp(i, x, run, hn))
        else:
            x = run.apply(n.resid_mid, res + a)
        h2, m = self._mlp_io(i, x, run, hn)
        return self._residual(i, x, h2, 2) + m

    def _residual(self, i: int, x: torch.Tensor, normed: torch.Tensor, alpha: int
                  ) -> torch.Tensor:
        """What a sublayer's branch is added to: its input x, or (``norm_residual``) its
        norm's output, times the layer's alpha (index `alpha` of its residual scales)."""
        res = normed if self.config.norm_residual else x
        sc = self.scales[i]
        return res if sc is None else res * sc[alpha]

    def _layer_call(self, layer: int, step: int, past: "KVCache | None",
                    kv: dict[int, tuple[torch.Tensor, torch.Tensor]],
                    tables: list[tuple[torch.Tensor, torch.Tensor]], masks: Masks,
                    explicit: bool | None, ple: torch.Tensor | None) -> "_LayerCall":
        """What attention block `layer` (schedule step `step`) needs from this call: its
        rotary table and masks, its KV-cache slot (none for a layer sharing an earlier
        layer's keys), the keys it shares (`kv`: the source layers' of this call, filled as
        they run) and the per-layer inputs."""
        c, r = self.config, self.settings[layer].rope
        device = masks.device
        return _LayerCall(
            rope=tables[r] if r is not None else None, masks=masks, explicit=explicit, ple=ple,
            cache_update=past.updater(step) if past is not None and not c.shares_kv(layer)
            else None,
            shared=self._shared_kv(layer, kv, device),
            keep=(lambda k_, v_: kv.__setitem__(layer, (k_, v_)))
            if layer in self._kv_sources else None, past=past, step=step)

    def _shared_kv(self, layer: int, kv: dict[int, tuple[torch.Tensor, torch.Tensor]],
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The keys and values `layer` shares with an earlier layer (None: its own), on
        `device`; an MIError if that layer has not run in this call."""
        c = self.config
        if not c.shares_kv(layer):
            return None
        src = c.kv_source_of(layer)
        if src not in kv:
            raise MIError(f"layer {layer} attends with the keys and values of layer {src}, "
                          f"which has not run before it in this call (layer_schedule)")
        k, v = kv[src]
        return (k.to(device), v.to(device)) if k.device != device else (k, v)

    def _mlp(self, i: int, x: torch.Tensor, run: HookRun,
             shared: torch.Tensor | None = None) -> torch.Tensor:
        """The MLP half of block `i`: its input x (resid_mid, or resid_pre in a parallel
        block) -> what the MLP adds to the residual stream (``hook_mlp_out``). `shared`:
        ln1's output, which a block with one shared norm feeds the MLP too."""
        return self._mlp_io(i, x, run, shared)[1]

    def _mlp_io(self, i: int, x: torch.Tensor, run: HookRun,
                shared: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the MLP's normalised input, at ``mlp.hook_in``; its output, at
        ``hook_mlp_out``) for :meth:`_mlp`."""
        c, lw, n = self.config, self.w.layers[i], self.names[i]
        mlp_in = run.apply(n.tl_mlp_in, x)  # resid_mid, or resid_pre in a parallel block
        if lw.ln2 is not None:
            h = lw.ln2(mlp_in, run, n.ln2_scale, n.ln2_normalized, out_name=n.mlp_in)
        elif not c.pre_norms:
            h = run.apply(n.mlp_in, mlp_in)
        else:  # one shared norm: the MLP reads ln1's output (recomputed if hook_mlp_in changed)
            h = lw.ln1(mlp_in) if run.spec.has_intervention_at(n.tl_mlp_in) or shared is None \
                else shared
            h = run.apply(n.mlp_in, h)
        if n.moe is not None and lw.moe is None:
            m = moe(lw.mlp, h, self.act, run, n.moe)  # type: ignore[arg-type]
        else:
            m = mlp(lw.mlp, h, self.act, run, n.mlp_pre, n.mlp_post, n.mlp_pre_linear,
                    sparsity=c.layer_sparsity[i] if c.layer_sparsity else 0.0,
                    gate_scale=c.mlp_gate_scale)
        if lw.moe is not None:  # Gemma-4: experts beside the dense MLP, each post-normed
            dense = run.apply(n.dense_out, lw.ln2_post_dense(m))
            experts_in = run.apply(n.moe_in, lw.ln2_moe(mlp_in))
            routed = moe(lw.moe, experts_in, self.act, run, n.moe, router_in=mlp_in)
            m = dense + run.apply(n.moe_out, lw.ln2_post_moe(routed))
        if lw.ln2_post is not None:
            m = lw.ln2_post(m, run, n.ln2_post_scale, n.ln2_post_normalized)
        if c.mlp_out_scale != 1.0:  # Falcon-H1's down multiplier
            m = m * c.mlp_out_scale
        if c.residual_scale != 1.0:
            m = m * c.residual_scale
        if self.scales[i] is not None:
            m = m * self.scales[i][3]  # type: ignore[index]
        return h, run.apply(n.mlp_out, m)

    # -- embedding and rotary tables ---------------------------------------------------
    def _embed(self, ids: torch.Tensor, positions: torch.Tensor, run: HookRun) -> torch.Tensor:
        """ids [batch, seq] -> layer 0's resid_pre: the token embedding (scaled for Gemma),
        plus the learned position embedding (``hook_pos_embed``) where the family has one."""
        c, w = self.config, self.w
        x = F.embedding(ids, w.embed)
        if c.embedding_scale is not None:
            x = x * torch.tensor(c.embedding_scale, dtype=x.dtype)
        x = run.apply("hook_embed", x)
        if w.pos_embed is not None:
            pos = F.embedding(positions + c.position_offset, w.pos_embed)
            x = x + run.apply("hook_pos_embed", pos)
        return x

    def _rope_tables(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) [batch, 1, seq, rot_dim] per configured rope (none without rotary);
        GPT-J's interleaved layout repeats each frequency twice instead of concatenating
        the two halves."""
        c = self.config
        if c.positions is not Positions.ROPE:
            return []
        out = []
        dtype = torch.float32 if c.rope_float32 else self.dtype  # then q/k rotate in float32
        for r, inv in zip(c.ropes, self.inv_freqs):
            cos, sin = cos_sin(self._inv_freq(r, inv, positions), positions, dtype,
                               attention_scaling(r))
            if c.rope_layout is RopeLayout.INTERLEAVED:
                half = cos.shape[-1] // 2
                cos = cos[..., :half].repeat_interleave(2, dim=-1)
                sin = sin[..., :half].repeat_interleave(2, dim=-1)
            out.append((cos, sin))
        return out

    # -- hook points -------------------------------------------------------------------
    def hook_points(self) -> list[HookPoint]:
        c = self.config
        names = ["hook_embed"] + (["hook_pos_embed"] if c.positions is Positions.LEARNED else [])
        for i, n in enumerate(self.names):
            lw = self.w.layers[i]
            names += mixer_layer_points(self, i) if lw.attn is None else \
                n.in_order(c) if lw.mixer is None else parallel_layer_points(self, i, n.in_order(c))
        names += ["altup.hook_out"] if c.altup is not None else []
        names += ["ln_final.hook_scale", "ln_final.hook_normalized"]
        return [HookPoint.parse(n) for n in names]

    def hook_shape(self, point: HookPoint | str, batch: int, seq: int) -> tuple[int, ...] | None:
        """Shape of the activation at `point` for ids [batch, seq] (key length -1: any): the
        core's standard table, plus this backend's q/k-norm, post-norm and MoE points."""
        hp = HookPoint.parse(point)
        c = self.config
        suffix = hp.suffix
        if hp.layer is not None and (own := mixer_hook_shape(self, hp.layer, suffix, batch,
                                                              seq)) is not None:
            return own
        layer = hp.layer if hp.layer is not None and 0 <= hp.layer < c.num_layers else 0
        hd, kv = c.head_dim_of(layer), c.kv_heads_of(layer)  # per layer (Gemma-4)
        extra = per_layer.hook_shape(c, suffix, batch, seq) or \
            altup.hook_shape(c, suffix, batch, seq)
        if extra is not None:
            return extra
        if suffix == "attn.hook_gate" and c.attn_output_gate:
            return (batch, seq, c.num_heads, c.head_dim)
        if suffix in ("attn.q_ln.hook_scale", "attn.k_ln.hook_scale"):
            heads = c.num_heads if suffix.startswith("attn.q") else kv
            return (batch, seq, 1) if c.qk_norm_full else (batch, seq, heads, 1)
        if c.moe is not None and suffix in ("mlp.hook_router_logits", "mlp.hook_expert_weights",
                                            "mlp.hook_expert_indices"):
            return (batch, seq, c.moe.num_experts if suffix.endswith("logits") else c.moe.top_k)
        extra = _extra_shape(c, suffix, batch, seq)
        if extra is not None:
            return extra
        shape = standard_shape(hp, batch, seq, d_model=c.hidden_size, n_heads=c.num_heads,
                               n_kv_heads=kv, d_head=hd, d_mlp=c.mlp_size_of(layer))
        if shape is not None:
            return shape
        return (batch, seq, 1) if suffix.endswith("hook_scale") else (batch, seq, c.hidden_size)

    def check_layer_schedule(self, schedule: Sequence[int]) -> None:
        """LayerSchedule capability: any layer order (repeats allowed) runs."""
        self._check_schedule(tuple(schedule), None)

    # -- generation --------------------------------------------------------------------
    def new_past(self, batch_size: int) -> KVCache:
        return KVCache(batch_size)

    def cache_bytes(self, batch: int, tokens: int) -> int:
        """ContextLength: the KV cache's keys and values after `tokens` tokens (one slot per
        layer; a layer_schedule that repeats layers keeps more)."""
        c = self.config  # (a layer sharing an earlier layer's keys keeps none of its own)
        per_token = sum(c.kv_heads_of(i) * c.head_dim_of(i) for i in range(c.num_layers)
                        if not c.shares_kv(i))
        return 2 * per_token * batch * tokens * self.dtype.itemsize

    # -- helpers of the forward -------------------------------------------------------
    def _head_inputs(self, i: int, x: torch.Tensor, run: HookRun
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """TransformerLens' ``hook_attn_in`` / ``hook_q_input`` / ``hook_k_input`` /
        ``hook_v_input``: resid_pre repeated per head [b, s, heads (kv_heads for k, v), d_model].

        Opt-in: None (the fused path) unless one is hooked; captured only, the forward is
        unchanged. An intervention there makes q/k/v read ln1 of each head's own input, and
        ln1's ``hook_scale`` / ``hook_normalized`` then fire on each of the three inputs
        ([b, s, heads or kv_heads, 1] / [..., d_model], as TransformerLens' ln1 of the
        per-head inputs: an edit of one head's copy changes only that head's q, k or v), not
        on the fused [b, s, 1] (the block's caller skips those names).
        """
        n = self.names[i]
        if not n.head_inputs or not (
                run.wants(n.tl_attn_in) or run.wants(n.q_input) or run.wants(n.k_input)
                or run.wants(n.v_input)):  # MLA / shared keys: no per-head inputs (no points)
            return None
        c, has = self.config, run.spec.has_intervention_at
        kv = c.kv_heads_of(i)
        # copies, not expanded views: a hook may write into its tensor in place
        rep = lambda t, heads: t.unsqueeze(2).expand(-1, -1, heads, -1).clone()  # noqa: E731
        attn_in = run.apply(n.tl_attn_in, rep(x, c.num_heads))
        # As TransformerLens: a changed hook_attn_in gives every query head its own keys and
        # values (GQA weights repeated per query head); otherwise k/v inputs are per KV head.
        kv_of = (lambda: attn_in.clone()) if kv == c.num_heads or has(
            n.tl_attn_in) else (lambda: rep(x, kv))
        ins = (run.apply(n.q_input, attn_in), run.apply(n.k_input, kv_of()),
               run.apply(n.v_input, kv_of()))
        if not any(has(p) for p in (n.tl_attn_in, n.q_input, n.k_input, n.v_input)):
            return None
        ln1 = self.w.layers[i].ln1
        if ln1 is None:  # no pre-norm (OLMo2): attention reads the per-head inputs as they are
            return ins
        s = c.attn_in_scale
        normed = [ln1(t, run, n.ln1_scale, n.ln1_normalized) for t in ins]
        return tuple(t * s if s != 1.0 else t for t in normed)  # type: ignore[return-value]

    def _inv_freq(self, rope: RopeConfig, cached: torch.Tensor, positions: torch.Tensor
                  ) -> torch.Tensor:
        if not rope.position_dependent:  # dynamic NTK, longrope
            return cached
        longest = int(positions.max()) + 1  # one sync, only for dynamic-NTK models
        return inv_freq(rope, self.config.rope_dim_of(rope), longest).to(self.device)

    def _check_schedule(self, schedule: tuple[int, ...], past: KVCache | None) -> None:
        bad = [i for i in schedule if not 0 <= i < self.num_layers]
        if bad:
            raise MIError(f"layer_schedule has layers {bad} outside 0..{self.num_layers - 1}")
        if past is not None:
            if past.schedule is not None and past.schedule != schedule:
                raise MIError(f"layer_schedule {list(schedule)} differs from the one this "
                              f"KV cache was built with {list(past.schedule)}")
            past.schedule = schedule

    def _positions(self, batch: int, seq: int, offset: int, mask: torch.Tensor | None,
                   past: KVCache | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(positions [batch, offset + seq] of every key slot, key validity [batch, offset +
        seq] or None if there is no padding). Positions count real tokens (cumsum of the mask)."""
        device = self.device
        if mask is not None and mask.shape[1] == seq and offset > 0:  # mask of the new tokens only
            prev = past.mask if past is not None and past.mask is not None else \
                torch.ones((batch, offset), dtype=torch.bool, device=device)
            mask = torch.cat([prev, mask.to(torch.bool)], dim=1)
        if mask is None and past is not None and past.mask is not None:
            mask = torch.cat([past.mask, torch.ones((batch, seq), dtype=torch.bool,
                                                    device=device)], dim=1)
        if mask is not None:
            if tuple(mask.shape) != (batch, offset + seq):
                raise MIError(f"attention_mask has shape {list(mask.shape)}; expected "
                              f"{[batch, seq]} or {[batch, offset + seq]} (cached + new)")
            mask = mask.to(device=device, dtype=torch.bool)
            positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
            if bool(mask.all()):
                mask = None
        else:
            positions = torch.arange(offset + seq, device=device).expand(batch, offset + seq)
        if past is not None:
            past.mask = mask
        top = offset + seq
        if self.config.positions is Positions.LEARNED and top > (self.max_positions or 0):
            raise MIError(f"sequence reaches position {top}, beyond the model's "
                          f"{self.max_positions} learned position embeddings")
        if self.max_positions is not None and top > self.max_positions and not self._warned_long:
            self._warned_long = True
            warnings.warn(f"sequence reaches position {top}, beyond the model's "
                          f"max_position_embeddings {self.max_positions}: RoPE is extrapolated "
                          f"and results may degrade", stacklevel=3)
        return positions, mask

    # -- pieces for analyses (logit lens, attribution) ---------------------------------
    def final_norm(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """The final norm of x [..., d_model]; `scale` [..., 1] replaces the computed divisor.
        On a placed model computed on the unembedding's device, returned on x's."""
        dev = self.layout.unembed
        if x.device == dev:
            return self.w.final_norm(x, scale=scale)
        return self.w.final_norm(x.to(dev), scale=None if scale is None else
                                 scale.to(dev)).to(x.device)

    def unembed(self, normalized: torch.Tensor) -> torch.Tensor:
        """[..., d_model] (after the final norm) -> logits [..., vocab], soft-capped if
        configured; on a placed model computed on the unembedding's device, returned on the
        input's."""
        if normalized.device != self.layout.unembed:
            return self.unembed(normalized.to(self.layout.unembed)).to(normalized.device)
        # (a residual stream kept in F32, residual_fp32, is read in the head's dtype)
        logits = F.linear(normalized.to(self.w.lm_head.dtype), self.w.lm_head,
                          self.w.lm_head_bias)
        if self.config.logit_scale != 1.0:  # Granite 1 / logits_scaling, Cohere logit_scale
            logits = logits * self.config.logit_scale
        cap = self.config.final_softcap
        return torch.tanh(logits / cap) * cap if cap is not None else logits

    def project_to_vocab(self, x: torch.Tensor) -> torch.Tensor:
        """Residual stream [..., d_model] -> logits [..., vocab] (the logit lens)."""
        return self.unembed(self.final_norm(x))

    def process_weights(self, **flags: bool) -> None:
        """TransformerLens' weight processing, in place (mi_transformer.processing)."""
        if self.layout.offload is not None:
            raise InputError(f"weight processing rewrites weights in place; an offloaded model "
                             f"(offload={self.layout.offload!r}) assembles each block afresh. "
                             f"Load without offload to process weights")
        process_weights(self, **flags)

    def get_weight(self, name: str, layer: int | None = None) -> torch.Tensor:
        """A weight in TransformerLens naming and layout (a view where possible).

        Global: W_E [vocab, d_model], W_U [d_model, vocab], W_pos [positions, d_model] (from
        position 0: OPT's two leading rows left out, as TransformerLens) and
        b_U [vocab] where the family has them, ln_final.w / ln_final.b. W_U and b_U include
        the family's logit multiplier (Granite's 1 / logits_scaling, Cohere's logit_scale,
        Falcon-H1's lm_head_multiplier; then a new tensor): logits = ln_final(x) @ W_U + b_U
        (before a final soft-cap), so logit attributions are in the logits' own units.
        Per layer: W_Q [heads, d_model, d_head], W_K / W_V [kv_heads, d_model, d_head],
        W_O [heads, d_head, d_model], b_Q [heads, d_head], b_K / b_V [kv_heads, d_head],
        b_O [d_model], W_in / W_gate / W_up [d_model, d_mlp] (W_in is the gate when gated),
        W_out [d_mlp, d_model], b_in / b_up / b_out, ln1.w / ln1.b / ln2.w / ln2.b
        (as stored: not folded into the next weights; Gemma's gain is 1 + w).
        """
        c, w = self.config, self.w
        if name == "W_E":
            return w.embed
        scale = c.logit_scale
        if name == "W_U":
            return w.lm_head.T if scale == 1.0 else (w.lm_head * scale).T
        if name == "b_U" and w.lm_head_bias is not None and scale != 1.0:
            return w.lm_head_bias * scale
        if name == "W_pos" and w.pos_embed is not None:  # the rows positions 0.. read (OPT
            return w.pos_embed[c.position_offset:]  # keeps 2 before them): a view
        if name in ("W_pos", "b_U"):
            return self._need(w.pos_embed if name == "W_pos" else w.lm_head_bias, name, None)
        if name in ("ln_final.w", "ln_final.b"):
            return self._need(w.final_norm.weight if name.endswith("w") else w.final_norm.bias,
                              name, None)
        if layer is None or not 0 <= layer < c.num_layers:
            raise WeightLoadError(f"weight {name!r} needs a layer in 0..{c.num_layers - 1}, "
                                  f"got {layer}")
        lw: LayerWeights = w.layers[layer]
        a, m = lw.attn, lw.mlp
        self._refuse_layer_weight(name, layer)
        h, kv, hd, d = c.num_heads, c.kv_heads_of(layer), c.head_dim_of(layer), c.hidden_size
        heads = lambda t, n: t.view(n, hd, d).transpose(1, 2)  # noqa: E731  [n, d_model, d_head]
        b_v = (a.b_v if a.w_v is not None or a.w_k is None else a.b_k) if a is not None else None
        getters: dict[str, Callable[[], torch.Tensor | None]] = {
            "W_Q": lambda: heads(a.w_q, h), "W_K": lambda: heads(a.w_k, kv),
            # values = the key projection where the layer has no v_proj (attention_k_eq_v)
            "W_V": lambda: heads(a.w_v if a.w_v is not None else a.w_k, kv),
            "W_O": lambda: a.w_o.view(d, h, c.v_head_dim if c.mla is not None else hd
                                      ).permute(1, 2, 0),
            "b_Q": lambda: None if a.b_q is None else a.b_q.view(h, hd),
            "b_K": lambda: None if a.b_k is None else a.b_k.view(kv, hd),
            "b_V": lambda: None if b_v is None else b_v.view(kv, hd),
            "b_O": lambda: a.b_o,
            "W_in": lambda: m.w_in.T, "b_in": lambda: m.b_in,
            "W_gate": lambda: m.w_in.T if m.w_up is not None else None,
            "W_up": lambda: None if m.w_up is None else m.w_up.T, "b_up": lambda: m.b_up,
            "W_out": lambda: m.w_out.T, "b_out": lambda: m.b_out,
            "ln1.w": lambda: lw.ln1.weight if lw.ln1 else None,
            "ln1.b": lambda: lw.ln1.bias if lw.ln1 else None,
            "ln2.w": lambda: lw.ln2.weight if lw.ln2 else None,
            "ln2.b": lambda: lw.ln2.bias if lw.ln2 else None,
        }
        if self.names[layer].moe is not None and name in (
                "W_in", "b_in", "W_gate", "W_up", "b_up", "W_out", "b_out"):
            raise WeightLoadError(f"layer {layer} is a mixture-of-experts MLP: {name} is per "
                                  f"expert (backend.w.layers[{layer}].mlp.experts[e].w_gate / "
                                  f"w_up / w_down, router backend.w.layers[{layer}].mlp.router)")
        if name not in getters:
            raise WeightLoadError(f"unknown weight name {name!r}; known: W_E, W_U, W_pos, b_U, "
                                  f"ln_final.w, "
                                  f"ln_final.b, {', '.join(getters)}")
        return self._need(getters[name](), name, layer)

    def _refuse_layer_weight(self, name: str, layer: int) -> None:
        """WeightLoadError when layer `layer` has no `name` in the residual stream's terms: a
        shared block's (Zamba2), a part the layer lacks, keys shared from an earlier layer,
        latent attention's q / k / v."""
        c, lw = self.config, self.w.layers[layer]
        a, m = lw.attn, lw.mlp
        if lw.shared is not None and (name in _ATTN_WEIGHTS or name in _MLP_WEIGHTS):
            raise WeightLoadError(
                f"layer {layer} runs a shared attention block on [residual | embeddings] (2 "
                f"d_model wide, with this layer's adapters) before its mixer: {name} is not a "
                f"weight of the residual stream; the block is backend.w.layers[{layer}].shared")
        if a is None and name in _ATTN_WEIGHTS or m is None and name in _MLP_WEIGHTS:
            part = "attention" if name in _ATTN_WEIGHTS else "an MLP"
            raise WeightLoadError(f"layer {layer} is a {self.layer_types[layer]!r} layer without "
                                  f"{part}: it has no {name}")
        if c.shares_kv(layer) and name in ("W_K", "W_V", "b_K", "b_V"):
            src = c.kv_source_of(layer)
            raise WeightLoadError(
                f"layer {layer} attends with the keys and values of layer {src} (shared KV): "
                f"it has no {name} of its own; its keys are layer {src}'s ({name} at layer "
                f"{src}, applied to layer {src}'s input)")
        if a is not None and a.mla is not None and name in ("W_Q", "W_K", "W_V", "b_Q", "b_K",
                                                            "b_V"):  # (a: None on a mixer layer)
            raise WeightLoadError(
                f"layer {layer} has multi-head latent attention: {name} is not a linear map of "
                f"the residual stream (q, k and v pass through RMS-normed latents); the "
                f"projections are backend.w.layers[{layer}].attn.mla (kv_a, kv_b, q / q_a, q_b)")

    def _need(self, t: torch.Tensor | None, name: str, layer: int | None) -> torch.Tensor:
        if t is None:
            where = f" at layer {layer}" if layer is not None else ""
            raise WeightLoadError(f"this {self.config.model_type} model has no {name}{where}")
        return t

    def __repr__(self) -> str:
        c = self.config
        return (f"TransformerBackend({c.model_type}, layers={c.num_layers}, d_model="
                f"{c.hidden_size}, heads={c.num_heads}/{c.num_kv_heads})")


@attrs.define(eq=False)
class _LayerCall:
    """What one attention block needs from its forward call besides the residual stream."""

    rope: tuple[torch.Tensor, torch.Tensor] | None  # the layer's (cos, sin), None: no rotary
    masks: Masks
    explicit: bool | None
    cache_update: Callable[..., Any] | None
    ple: torch.Tensor | None = None  # every layer's per-layer input [b, s, L, p]
    shared: tuple[torch.Tensor, torch.Tensor] | None = None  # an earlier layer's keys / values
    keep: Callable[[torch.Tensor, torch.Tensor], None] | None = None  # keep this layer's
    past: "KVCache | None" = None  # the cache, whose slot `step` a mixer beside attention uses
    step: int = 0


class KVCache:
    """Rotated keys and values per *schedule step* (not per layer: a layer run twice by a
    `layer_schedule` has two slots), plus the attention mask seen so far.

    Every key is kept (no rolling window), so sliding-window layers stay exact at any length.
    """

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.keys: dict[int, torch.Tensor] = {}  # step -> [batch, kv_heads, length, d_head]
        self.values: dict[int, torch.Tensor] = {}
        self.length = 0  # cached positions (slots)
        self.mask: torch.Tensor | None = None  # [batch, length] bool, None = no padding
        self.schedule: tuple[int, ...] | None = None
        self.states: dict[int, Any] = {}  # step -> a mixer's recurrent state (mixers.py)

    def updater(self, step: int) -> Callable[[torch.Tensor, torch.Tensor],
                                             tuple[torch.Tensor, torch.Tensor]]:
        def update(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if step in self.keys:
                k = torch.cat([self.keys[step], k], dim=2)
                v = torch.cat([self.values[step], v], dim=2)
            self.keys[step], self.values[step] = k, v
            return k, v
        return update


def _extra_shape(c: TransformerConfig, suffix: str, batch: int, seq: int
                 ) -> tuple[int, ...] | None:
    """Shapes of the points only some families have: attention sinks [heads], MLA's latents
    and its per-head widths (q/k: nope + rope dims, v / z: v_head_dim)."""
    if suffix == "attn.hook_sinks":
        return (c.num_heads,)
    if c.mla is None:
        return None
    if suffix == "attn.hook_q_latent":
        return (batch, seq, c.mla.q_lora_rank or 0)
    if suffix == "attn.hook_kv_latent":
        return (batch, seq, c.mla.kv_lora_rank)
    if suffix in ("attn.hook_v", "attn.hook_z"):
        return (batch, seq, c.num_heads, c.mla.v_head_dim)
    return None
