"""Layers that run a plugin's sequence mixer instead of attention (state-space and hybrid
models): the block, its hook points, and the state interventions such a model declares.

A layer with a mixer is ``x + mixer(norm(x))``, followed (where the config gives the layer
an MLP) by the same MLP half as an attention block. The mixer comes from a plugin through
``mi_core.plugin.mixer(name)`` (the config's :class:`~mi_transformer.config.MixerConfig`);
this backend never imports it. The block hooks the norm's output at the mixer's input point
(``blocks.{i}.ssm.hook_in`` for mi-ssm's mixers), the mixer its own points, and the block
``blocks.{i}.hook_mixer_out`` (what the mixer adds to the residual stream). A hybrid is the
same generic block with attention on some layers: nothing here checks a family name.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from mi_core.plugin import HookRun, InterventionError, StateKnockoutSpec, StateSteeringSpec

from mi_transformer.attention import Masks
from mi_transformer.shared_block import shared_block, shared_points, shared_shape

#: The backend (mi_transformer.model.TransformerBackend, which imports this module: typed
#: loosely so that no import goes back) and its KV cache.
Backend = Any


def mixer_block(be: Backend, i: int, x: torch.Tensor, run: HookRun,
                past: Any, step: int, masks: Masks,
                shared: tuple[torch.Tensor, Any, bool | None] | None = None) -> torch.Tensor:
    """Layer `i` (schedule step `step`) with a mixer: x [batch, seq, d_model] -> the same.

    The mixer reads its state from the cache slot of `step` (created on first use) and
    updates it in place; without a cache it starts from zeros. Padding (the mask's False
    slots) leaves the state untouched. With ``residual_fp32`` the residual stream is kept in
    F32 and the norm reads it cast to the model's dtype (transformers' Mamba blocks).
    `shared`: (the embeddings, the layer's rotary tables, the attention path) for a layer that
    runs a shared attention block first (Zamba2, :mod:`mi_transformer.shared_block`): its
    output joins the mixer's norm input, its keys and values the cache slot of `step`.
    """
    c, lw, n = be.config, be.w.layers[i], be.names[i]
    mixer = lw.mixer
    x = run.apply(n.resid_pre, x)
    if mixer is None:  # a layer without a sequence mixer: x + mlp(norm(x)) (MLP_ONLY)
        return run.apply(n.resid_post, x + be._mlp(i, x, run))
    src = x
    if shared is not None:
        emb, rope, explicit = shared
        src = x + shared_block(lw.shared, x, emb, run, be.shared_names[i], layer_names=n,
                               ls=be.settings[i], rope=rope, masks=masks, act=be.act,
                               explicit=explicit,
                               cache_update=past.updater(step) if past is not None else None)
    h = lw.ln1(src.to(be.dtype), run, n.ln1_scale, n.ln1_normalized, out_name=n.mixer_in)
    state = None
    if past is not None:
        state = past.states.get(step)
        if state is None:
            state = past.states[step] = mixer.new_state(x.shape[0])
    m = mixer.forward(h, run, state=state, active=masks.new_valid(), offset=masks.offset)
    if c.residual_scale != 1.0:  # Granite 4: every branch scaled before the residual add
        m = m * c.residual_scale
    sc = be.scales[i]
    if sc is not None:  # MiniMax: residual * alpha + branch * beta
        m = m * sc[1]
    m = run.apply(n.mixer_out, m)
    x = be._residual(i, x.float() if c.residual_fp32 else x, h, 0) + m
    if c.has_mlp(i):
        x = run.apply(n.resid_mid, x)
        h2, mo = be._mlp_io(i, x, run)
        x = be._residual(i, x, h2, 2) + mo
    return run.apply(n.resid_post, x)


def mixer_layer_points(be: Backend, i: int) -> list[str]:
    """Layer `i`'s hook names in execution order: the residual and norm points, the mixer's
    own, ``hook_mixer_out``, then the MLP half's where the layer has one."""
    n, mixer = be.names[i], be.w.layers[i].mixer
    if mixer is None:  # MLP_ONLY
        return [n.resid_pre] + n.mlp_points(be.config) + [n.resid_post]
    out = [n.resid_pre]
    if be.w.layers[i].shared is not None:  # Zamba2: the shared block's points first
        out += shared_points(be.shared_names[i], n.attn, n, n.rotary)
    out += [n.ln1_scale, n.ln1_normalized]
    out += [f"blocks.{i}.{p}" for p in mixer.points] + [n.mixer_out]
    c = be.config
    if c.has_mlp(i):  # pre-norm mixer layers in a post-norm model: the MLP's points as such
        out += [n.resid_mid] + n.mlp_points(attrs.evolve(c, pre_norms=True, post_norms=False)
                                            if c.mixer_pre_norms else c)
    return out + [n.resid_post]


def check_state_spec(be: Backend, spec: StateKnockoutSpec | StateSteeringSpec,
                     seq: int | None) -> None:
    """The StateInterventions capability of a model with recurrent mixers: positions in the
    call (without a carried state), targeted layers that have a recurrent mixer (a
    typed refusal naming an attention layer), heads within each targeted mixer's."""
    spec.validate(be.num_layers, seq)
    recurrent = [i for i, lw in enumerate(be.w.layers) if lw.mixer is not None]
    for layer in spec.target_layers if spec.target_layers is not None else recurrent:
        if layer not in recurrent:
            raise InterventionError(
                f"{type(spec).__name__}: layer {layer} is a {be.layer_types[layer]!r} layer, "
                f"which has no recurrent state; layers with one: {recurrent}")
        heads = be.w.layers[layer].mixer.heads
        bad = [h for h in spec.target_heads or [] if h >= heads]
        if bad:
            raise InterventionError(f"{type(spec).__name__}: heads {bad} out of range; layer "
                                    f"{layer}'s mixer has heads 0..{heads - 1}")


def mixer_hook_shape(be: Backend, layer: int, suffix: str, batch: int,
                     seq: int) -> tuple[int, ...] | None:
    """The shape of a mixer's own point (None: not one of them)."""
    lw: Any = be.w.layers[layer] if 0 <= layer < be.num_layers else None
    mixer = lw.mixer if lw is not None else None
    if mixer is None or suffix not in mixer.points:
        return shared_shape(be.config, suffix, batch, seq) if lw is not None and \
            lw.shared is not None else None
    return mixer.hook_shape(suffix, batch, seq)
