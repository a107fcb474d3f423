"""Layers that run a plugin's sequence mixer instead of attention (state-space and hybrid
models): the block, its hook points, and the state interventions such a model declares.

A layer with a mixer is ``x + mixer(norm(x))``, followed (where the config gives the layer
an MLP) by the same MLP half as an attention block. The mixer comes from a plugin through
``mi_core.plugin.mixer(name)`` (the config's :class:`~mi_transformer.config.MixerConfig`);
this backend never imports it. The block hooks the norm's output at the mixer's input point
(``blocks.{i}.ssm.hook_in`` for mi-ssm's mixers), the mixer its own points, and the block
``blocks.{i}.hook_mixer_out`` (what the mixer adds to the residual stream). A hybrid is the
same generic block with attention on some layers: nothing here checks a family name.

A layer may also run its mixer *beside* attention (``TransformerConfig.layer_parallel``,
Falcon-H1): the attention block calls :func:`mixer_branch` on ln1's output and adds both
branches, ``x + (mixer(h) + attn(h))``; the layer then has every attention point and the
mixer's, ``hook_mixer_out`` and ``hook_attn_out`` each carrying its own branch.
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
    x = run.apply(n.resid_pre, x)
    if lw.mixer is None:  # a layer without a sequence mixer: x + mlp(norm(x)) (MLP_ONLY)
        return run.apply(n.resid_post, x + be._mlp(i, x, run))
    src = x
    if shared is not None:
        emb, rope, explicit = shared
        src = x + shared_block(lw.shared, x, emb, run, be.shared_names[i], layer_names=n,
                               ls=be.settings[i], rope=rope, masks=masks, act=be.act,
                               explicit=explicit,
                               cache_update=past.updater(step) if past is not None else None)
    # the mixer's input point is the norm's output (what the residual reads too, where it
    # is the norm's output: MiniMax), unless the mixer reads it scaled
    hooked = c.mixer_in_scale == 1.0
    h = lw.ln1(src.to(be.dtype), run, n.ln1_scale, n.ln1_normalized,
               out_name=n.mixer_in if hooked else "")
    m = mixer_branch(be, i, h, run, past, step, masks, hooked=hooked)
    x = be._residual(i, x.float() if c.residual_fp32 else x, h, 0) + m
    if c.has_mlp(i):
        x = run.apply(n.resid_mid, x)
        h2, mo = be._mlp_io(i, x, run)
        x = be._residual(i, x, h2, 2) + mo
    return run.apply(n.resid_post, x)


def mixer_branch(be: Backend, i: int, h: torch.Tensor, run: HookRun, past: Any, step: int,
                 masks: Masks, *, hooked: bool = False) -> torch.Tensor:
    """Layer `i`'s mixer on the norm's output h [batch, seq, d_model] -> what it adds to the
    residual stream (hooked at ``hook_mixer_out``).

    The input (times ``mixer_in_scale``) is hooked at the mixer's input point; the mixer
    reads its state from the cache slot of `step` (created on first use) and updates it in
    place, without a cache it starts from zeros; padding (the mask's False slots) leaves the
    state untouched. The output is scaled by ``mixer_out_scale`` and ``residual_scale``.
    """
    c, mixer, n = be.config, be.w.layers[i].mixer, be.names[i]
    if not hooked:  # (`hooked`: h is already the value at the mixer's input point)
        h = run.apply(n.mixer_in, h * c.mixer_in_scale if c.mixer_in_scale != 1.0 else h)
    state = None
    if past is not None:
        state = past.states.get(step)
        if state is None:
            state = past.states[step] = mixer.new_state(h.shape[0])
    m = mixer.forward(h, run, state=state, active=masks.new_valid(), offset=masks.offset)
    if c.mixer_out_scale != 1.0:  # Falcon-H1's ssm_out_multiplier
        m = m * c.mixer_out_scale
    if c.residual_scale != 1.0:  # Granite 4: every branch scaled before the residual add
        m = m * c.residual_scale
    sc = be.scales[i]
    if sc is not None:  # MiniMax: residual * alpha + branch * beta
        m = m * sc[1]
    return run.apply(n.mixer_out, m)


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


def parallel_layer_points(be: Backend, i: int, attention_points: list[str]) -> list[str]:
    """A layer with its mixer beside attention: the attention layer's points (in order) with
    the mixer's own and ``hook_mixer_out`` before ``attn.hook_in`` (the mixer runs first)."""
    n = be.names[i]
    at = attention_points.index(n.attn_in)
    own = [f"blocks.{i}.{p}" for p in be.w.layers[i].mixer.points] + [n.mixer_out]
    return attention_points[:at] + own + attention_points[at:]


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
