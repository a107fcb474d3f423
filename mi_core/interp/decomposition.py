"""Residual-stream decomposition and direct logit attribution (DLA).

The final residual is a sum: ``resid_post[L-1] = resid_pre[0] + sum_i attn_out[i] + mlp_out[i]``,
and ``attn_out[i] = sum_h z[i, h] @ W_O[i, h] + b_O[i]``. Given the final norm's scale
captured on the run (``ln_final.hook_scale``), the final norm is affine in its input, so
each component's contribution to the logits is well defined:
``attr(c) = unembed(norm(c) - norm(0))`` with ``norm(x) = backend.final_norm(x, scale)``.
The constant ``unembed(norm(0)) + b_U`` is the remainder that makes the attributions sum
to the logits. Attributions use ``W_U`` directly when the backend has ``get_weight`` (so
they are linear; a final logit soft-cap is then part of the remainder).
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import torch

from mi_core.plugin import (
    HookCache, HookPoint, HookSpec, MIError, MIModel, Readout, WeightAccess,
    has_capability, require_head_sum, require_points, require_residual_sum,
)
from mi_core.tl.activation_cache import (
    attention_output_gate, head_results, layer_outputs, stack_points,
)
from mi_core.interp._common import as_ids, norm_position, resolve_token, token_str


def decomposition_points(model: MIModel, heads: bool = False) -> list[HookPoint]:
    """The points a decomposition needs (capture them, then call the functions below).

    A layer whose mixer is not attention (``hook_mixer_out`` instead of ``hook_attn_out``)
    contributes its mixer output, and its resid_mid / MLP output only where it has an MLP;
    a layer with an MLP alone (no mixer) its MLP output, an attention layer without an MLP its
    attention output; a layer with a mixer beside attention both outputs. A model whose
    residual stream is not such a sum (a scalar per layer, several streams; ``ResidualTerms``)
    is refused with a CapabilityError saying why."""
    require_residual_sum(model.backend, "residual decomposition")
    pts = [HookPoint.resid_pre(0)]
    if model.has_hook_point(HookPoint.ln_final_scale()):  # needed by apply_ln_to_stack only
        pts.append(HookPoint.ln_final_scale())
    for i in range(model.num_layers):
        if not model.has_hook_point(HookPoint.attn_out(i)) and (
                model.has_hook_point(HookPoint.mixer_out(i))
                or model.has_hook_point(HookPoint.mlp_out(i))):
            pts += [p for p in (HookPoint.mixer_out(i), HookPoint.resid_mid(i),
                                HookPoint.mlp_out(i)) if model.has_hook_point(p)]
            pts.append(HookPoint.resid_post(i))
            continue
        if model.has_hook_point(HookPoint.mixer_out(i)):  # a mixer beside attention
            pts.append(HookPoint.mixer_out(i))
        if model.has_hook_point(HookPoint.mlp_out(i)):
            pts += [HookPoint.resid_mid(i), HookPoint.attn_out(i), HookPoint.mlp_out(i),
                    HookPoint.resid_post(i)]
        else:  # an attention layer without an MLP
            pts += [HookPoint.attn_out(i), HookPoint.resid_post(i)]
        if heads:
            pts.append(HookPoint.attn_z(i))
            gate = attention_output_gate(model, i)
            if gate is not None:
                pts.append(gate)
    return pts


def run_for_decomposition(model: MIModel, prompt: Any, heads: bool = False) -> HookCache:
    """Forward `prompt` capturing every point the decomposition needs."""
    pts = decomposition_points(model, heads)
    require_points(model, pts)
    return model.forward(as_ids(model, prompt), HookSpec().capture_all(pts))


def accumulated_resid(cache: HookCache, num_layers: int, incl_mid: bool = False
                      ) -> tuple[torch.Tensor, list[str]]:
    """The residual stream before layer 0 and after each layer: [n, batch, seq, d_model].

    Labels: "0_pre", then "i_mid" (when `incl_mid`) and "i_post" per layer.
    """
    items = [(HookPoint.resid_pre(0), "0_pre")]
    for i in range(num_layers):
        if incl_mid:
            items.append((HookPoint.resid_mid(i), f"{i}_mid"))
        items.append((HookPoint.resid_post(i), f"{i}_post"))
    return stack_points(cache, items)  # shared with ActivationCache.accumulated_resid


def decompose_resid(cache: HookCache, num_layers: int) -> tuple[torch.Tensor, list[str]]:
    """The final residual split into "embed" (resid_pre 0), "{i}_attn" and "{i}_mlp":
    [2 * num_layers + 1, batch, seq, d_model]; the components sum to ``resid_post[L-1]``.
    A recurrent layer's term is "{i}_mixer" (``hook_mixer_out``), where it was captured
    instead of ``hook_attn_out`` (both, "{i}_attn" then "{i}_mixer", for a mixer beside
    attention); a layer without an MLP has no "{i}_mlp"."""
    captured = (lambda p: p in cache) if any(
        HookPoint.mixer_out(i) in cache for i in range(num_layers)) else None
    return stack_points(cache, [(HookPoint.resid_pre(0), "embed")]
                        + layer_outputs(num_layers, has=captured))


def stack_head_results(model: MIModel, cache: HookCache, layers: Sequence[int] | None = None,
                       include_bias: bool = True) -> tuple[torch.Tensor, list[str]]:
    """Per-head attention outputs ``z[:, :, h] @ W_O[h]``: [n_layers * heads (+ biases), batch,
    seq, d_model], labels "L{i}H{h}" (and "L{i}_bias" for ``b_O`` when the model has one).

    Uses ``attn.hook_result`` when captured, else ``attn.hook_z`` and ``W_O`` from the
    backend (``get_weight``). Per layer, heads + bias sum to ``hook_attn_out``; a model where
    they cannot (a norm on the attention output, a scale on it) is a
    CapabilityError (:class:`mi_core.capabilities.HeadTerms`).
    """
    require_head_sum(model.backend, "stack_head_results")
    layers = range(model.num_layers) if layers is None else layers
    parts: list[torch.Tensor] = []
    labels: list[str] = []
    for i in layers:
        res = head_results(model, cache, i)  # shared with ActivationCache.compute_head_results
        for h in range(res.shape[2]):
            parts.append(res[:, :, h])
            labels.append(f"L{i}H{h}")
        if include_bias:
            b = _weight(model, "b_O", i, optional=True)
            if b is not None:
                parts.append(b.to(res.dtype).expand_as(res[:, :, 0]))
                labels.append(f"L{i}_bias")
    return torch.stack(parts), labels


def _weight(model: MIModel, name: str, layer: int | None, optional: bool = False
            ) -> torch.Tensor | None:
    if optional and not has_capability(model.backend, WeightAccess):
        return None
    model.require(WeightAccess, f"weight {name}")
    try:
        return model.backend.get_weight(name, layer)
    except MIError:
        if optional:
            return None
        raise


def apply_ln_to_stack(model: MIModel, stack: torch.Tensor, cache: HookCache,
                      position: int | None = None) -> torch.Tensor:
    """Each component through the final norm as it acted on this run: linear part only.

    stack [n, batch, seq, d] (or [n, batch, d] with `position` given) -> same shape. Uses the
    captured ``ln_final.hook_scale`` [batch, seq, 1]; the affine offset ``norm(0)`` is removed
    so the results add up: ``sum(apply_ln_to_stack(c)) + norm(0) == norm(sum(c))``.
    """
    scale = cache.require(HookPoint.ln_final_scale())
    if position is not None:
        scale = scale[:, position]
    model.require(Readout, "apply_ln_to_stack (the final norm as a function)")
    norm = model.backend.final_norm
    return norm(stack, scale=scale) - norm(torch.zeros_like(stack[:1]), scale=scale)


@attrs.define
class LogitAttribution:
    """Direct logit attribution at one position: one value per component, plus the constant
    remainder (final-norm offset and unembedding bias); ``sum(values) + remainder == logit``
    (or logit difference when `incorrect` was given)."""

    labels: list[str]
    values: list[float]
    token: int
    token_str: str
    incorrect: int | None
    position: int
    remainder: float
    total: float

    def top(self, k: int = 10) -> list[tuple[str, float]]:
        order = sorted(range(len(self.values)), key=lambda i: -abs(self.values[i]))
        return [(self.labels[i], self.values[i]) for i in order[:k]]


def logit_attrs(model: MIModel, stack: torch.Tensor, cache: HookCache, token: int,
                incorrect: int | None = None, position: int = -1) -> torch.Tensor:
    """Contribution of each component to the logit of `token` (minus `incorrect`'s):
    stack [n, batch, seq, d] -> [n, batch]."""
    seq = stack.shape[2]
    p = norm_position(position, seq)
    normed = apply_ln_to_stack(model, stack[:, :, p], cache, p)  # [n, b, d]
    w_u = _weight(model, "W_U", None, optional=True)  # [d, vocab]
    if w_u is not None:  # linear in the component (logit soft-capping is not applied)
        cols = [token] + ([incorrect] if incorrect is not None else [])
        lg = normed @ w_u[:, cols].to(normed.dtype)
        return lg[..., 0] - (lg[..., 1] if incorrect is not None else 0.0)
    model.require(Readout, "logit attribution without W_U (the unembedding as a function)")
    logits = model.backend.unembed(normed) - model.backend.unembed(torch.zeros_like(normed[:1]))
    out = logits[..., token]
    if incorrect is not None:
        out = out - logits[..., incorrect]
    return out


def direct_logit_attribution(model: MIModel, prompt: Any, token: int | str | None = None,
                             incorrect: int | str | None = None, position: int = -1,
                             per_head: bool = False) -> LogitAttribution:
    """DLA for `prompt` at `position` over embed / each attention layer (or each head with
    `per_head`) / each MLP. `token` defaults to the model's top-1 prediction."""
    cache = run_for_decomposition(model, prompt, heads=per_head)
    p = norm_position(position, cache.output.shape[1])
    tok = int(cache.output[0, p].argmax()) if token is None else resolve_token(model, token)
    inc = None if incorrect is None else resolve_token(model, incorrect)
    if per_head:
        emb = cache.require(HookPoint.resid_pre(0))[None]
        heads, hl = stack_head_results(model, cache)
        mlps = torch.stack([cache.require(HookPoint.mlp_out(i)) for i in range(model.num_layers)])
        stack = torch.cat([emb, heads, mlps])
        labels = ["embed"] + hl + [f"{i}_mlp" for i in range(model.num_layers)]
    else:
        stack, labels = decompose_resid(cache, model.num_layers)
    vals = logit_attrs(model, stack, cache, tok, inc, p)[:, 0].float()
    logits = cache.output[0, p].float()
    total = float(logits[tok] - (logits[inc] if inc is not None else 0.0))
    return LogitAttribution(labels, vals.tolist(), tok, token_str(model, tok), inc, p,
                            total - float(vals.sum()), total)
