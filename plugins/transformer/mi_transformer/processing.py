"""Weight processing as TransformerLens' ``process_weights`` (``weight_processing.py``).

- ``fold_ln``: each pre-norm's gain (Gemma: 1 + w) multiplies the input columns of the weights
  that read it (ln1 -> W_Q, W_K, W_V; ln2 -> the MLP's input projections; ln_final -> the
  unembedding), a LayerNorm's bias becomes part of their biases, and for LayerNorm those
  weights are centred over d_model (the normalised input has zero mean). The norm keeps
  only its normalisation (gain 1, no bias). Post-norms (Gemma 2/3) are not folded, as in
  TransformerLens.
- ``center_writing_weights`` (LayerNorm models only, as TransformerLens): W_E, W_pos, W_O,
  b_O, W_out, b_out have zero mean over d_model (the next LayerNorm removes the mean anyway).
- ``center_unembed``: W_U (and b_U) have zero mean over the vocabulary: every logit of a
  position shifts by the same amount, so probabilities are unchanged; refused before a final
  soft-cap (Gemma 2, Gemma-3n, Gemma-4), which is not invariant to that shift
  (TransformerLens' ``from_pretrained`` turns it off there).
- ``fold_value_biases``: b_O += sum_h b_V[h] @ W_O[h] and b_V = 0 (attention rows sum to 1).

Refused with an ``MIError`` where the numbers would change: ``fold_ln`` /
``center_writing_weights`` on mixture-of-experts models, on latent attention (MLA: the
folded gain would have to go through the latent norms) and with Laurel blocks (Gemma-3n: they
add ln1's output itself to the residual), ``fold_value_biases`` with attention sinks (gpt-oss:
a row's pattern sums to less than 1, so b_V does not move into b_O) and with value norms
(Gemma-3n / Gemma-4: the values are RMS-normed per head). Gemma-4's MoE beside the dense MLP
is refused as an MoE.

Every step builds new tensors (never writes into a loaded one), so a tied embedding /
unembedding or a fused checkpoint's row views stay consistent.
"""

from __future__ import annotations

from typing import Protocol

import torch

from mi_core.plugin import MIError

from mi_transformer.attention import AttnWeights
from mi_transformer.config import NormType, TransformerConfig
from mi_transformer.mlp import MlpWeights
from mi_transformer.norm import Norm
from mi_transformer.weights import Weights


class HasWeights(Protocol):
    """What processing reads and rewrites: a :class:`~mi_transformer.model.TransformerBackend`
    (typed structurally, so this module does not import the model that calls it)."""

    config: TransformerConfig
    w: Weights


def process_weights(be: HasWeights, fold_ln: bool = True,
                    center_writing_weights: bool = True, center_unembed: bool = True,
                    fold_value_biases: bool = True) -> None:
    """Rewrite `be`'s weights in place (see the module docstring for each flag)."""
    c, w = be.config, be.w
    layer_norm = c.norm_type is NormType.LAYER_NORM
    mixers = [i for i, lw in enumerate(w.layers) if lw.mixer is not None]
    if (fold_ln or center_writing_weights) and mixers:
        raise MIError(f"process_weights: fold_ln / center_writing_weights are not implemented "
                      f"for layers with a sequence mixer (layers {mixers} of this "
                      f"{c.model_type} model); use fold_ln=False, center_writing_weights=False")
    if (fold_ln or center_writing_weights) and any(
            not isinstance(lw.mlp, MlpWeights | None) or lw.moe is not None for lw in w.layers):
        raise MIError(f"process_weights: fold_ln / center_writing_weights are not implemented "
                      f"for mixture-of-experts models ({c.model_type}); use fold_ln=False, "
                      f"center_writing_weights=False")
    if (fold_ln or center_writing_weights) and c.mla is not None:
        raise MIError(f"process_weights: fold_ln / center_writing_weights are not implemented "
                      f"for multi-head latent attention ({c.model_type}); use fold_ln=False, "
                      f"center_writing_weights=False")
    if (fold_ln or center_writing_weights) and c.laurel_rank:
        raise MIError(f"process_weights: fold_ln / center_writing_weights are not implemented "
                      f"for Laurel blocks ({c.model_type}: Laurel adds ln1's output itself to "
                      f"the residual, so ln1's gain cannot move into W_Q / W_K / W_V); use "
                      f"fold_ln=False, center_writing_weights=False")
    if fold_value_biases and c.v_norm and any(
            lw.attn is not None and (lw.attn.b_v is not None or lw.attn.b_k is not None)
            for lw in w.layers):
        raise MIError(f"process_weights: fold_value_biases would change the numbers of "
                      f"{c.model_type}: its values are RMS-normed per head, so b_V does not "
                      f"pass through to b_O; use fold_value_biases=False")
    if fold_value_biases and c.attn_sinks and any(lw.attn.b_v is not None for lw in w.layers):
        raise MIError(f"process_weights: fold_value_biases would change the numbers of "
                      f"{c.model_type}: with attention sinks a pattern row sums to less than 1, "
                      f"so b_V cannot move into b_O; use fold_value_biases=False")
    if center_unembed and c.final_softcap is not None:
        raise MIError(f"process_weights: center_unembed would change the numbers of "
                      f"{c.model_type}: its logits are soft-capped (final_logit_softcapping "
                      f"{c.final_softcap}), and the cap is not invariant to the per-position "
                      f"shift centring adds (TransformerLens turns it off for these models); "
                      f"use center_unembed=False")
    if fold_ln:
        for lw in w.layers:
            if lw.ln1 is not None:
                _fold_attn(lw.attn, lw.ln1, layer_norm)
                # parallel block with one norm: the MLP reads ln1 too (no MLP: attn_only)
                shared = lw.ln2 is None and lw.mlp is not None
                if shared:
                    _fold_mlp(lw.mlp, lw.ln1, layer_norm)  # type: ignore[arg-type]
                _reset(lw.ln1)
            if lw.ln2 is not None:
                _fold_mlp(lw.mlp, lw.ln2, layer_norm)  # type: ignore[arg-type]
                _reset(lw.ln2)
        fn = w.final_norm
        head, bias = _fold_rows(w.lm_head, w.lm_head_bias, fn, layer_norm)
        w.lm_head, w.lm_head_bias = head, bias
        _reset(fn)
    if center_writing_weights and layer_norm:
        w.embed = _centre(w.embed, -1)
        if w.pos_embed is not None:
            w.pos_embed = _centre(w.pos_embed, -1)
        for lw in w.layers:
            a, m = lw.attn, lw.mlp
            a.w_o = _centre(a.w_o, 0)
            a.b_o = None if a.b_o is None else _centre(a.b_o, 0)
            if m is None:  # an attention layer without an MLP
                continue
            m.w_out = _centre(m.w_out, 0)
            m.b_out = None if m.b_out is None else _centre(m.b_out, 0)
    if center_unembed:
        w.lm_head = _centre(w.lm_head, 0)
        if w.lm_head_bias is not None:
            w.lm_head_bias = _centre(w.lm_head_bias, 0)
    if fold_value_biases:
        for lw in w.layers:
            if lw.attn is None:  # a mixer's layer: no value bias to fold
                continue
            _fold_value_bias(lw.attn, c.num_heads, c.num_kv_heads, c.head_dim)
            if center_writing_weights and layer_norm and lw.attn.b_o is not None:
                lw.attn.b_o = _centre(lw.attn.b_o, 0)


def _centre(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t - t.mean(dim=dim, keepdim=True)


def _fold_rows(weight: torch.Tensor, bias: torch.Tensor | None, norm: Norm, layer_norm: bool
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A projection [out, d_model] reading `norm`'s output -> (weight * gain, bias + W beta),
    centred over d_model for LayerNorm."""
    if norm.bias is not None:
        extra = weight @ norm.bias.to(weight.dtype)
        bias = extra if bias is None else bias + extra
    folded = weight * norm.gain.to(weight.dtype)[None, :]
    if layer_norm:
        folded = _centre(folded, 1)
    return folded, bias


def _fold_attn(a: AttnWeights, norm: Norm, layer_norm: bool) -> None:
    """(A layer sharing an earlier layer's keys has no W_K / W_V; one whose values are its
    keys no W_V: the values follow the folded W_K.)"""
    a.w_q, a.b_q = _fold_rows(a.w_q, a.b_q, norm, layer_norm)
    if a.w_k is not None:
        a.w_k, a.b_k = _fold_rows(a.w_k, a.b_k, norm, layer_norm)
    if a.w_v is not None:
        a.w_v, a.b_v = _fold_rows(a.w_v, a.b_v, norm, layer_norm)
    if a.w_gate is not None:  # the output gate reads the same normalised input
        a.w_gate, a.b_gate = _fold_rows(a.w_gate, a.b_gate, norm, layer_norm)


def _fold_mlp(m: MlpWeights, norm: Norm, layer_norm: bool) -> None:
    m.w_in, m.b_in = _fold_rows(m.w_in, m.b_in, norm, layer_norm)
    if m.w_up is not None:
        m.w_up, m.b_up = _fold_rows(m.w_up, m.b_up, norm, layer_norm)


def _reset(norm: Norm) -> None:
    """The norm keeps only its normalisation: gain 1 (Gemma: stored weight 0), no bias."""
    one = torch.ones_like(norm.gain)
    norm.weight = torch.zeros_like(norm.weight) if norm.kind is NormType.GEMMA_RMS else one
    norm.gain, norm.bias = one, None


def _fold_value_bias(a: AttnWeights, heads: int, kv_heads: int, d_head: int) -> None:
    if a.b_v is None:
        return
    b_v = a.b_v.view(kv_heads, d_head).repeat_interleave(heads // kv_heads, 0).reshape(-1)
    shift = a.w_o @ b_v.to(a.w_o.dtype)  # sum_h b_V[h] @ W_O[h]: [d_model]
    a.b_o = shift if a.b_o is None else a.b_o + shift
    a.b_v = torch.zeros_like(a.b_v)
