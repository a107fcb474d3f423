"""Every hook name of one layer of the generic forward (:class:`LayerNames`), built once at
load so that a forward formats no strings, and each layer's points in execution order."""

from __future__ import annotations

import attrs

from mi_transformer.attention import AttnNames
from mi_transformer.config import BlockLayout, MlpLayout, TransformerConfig
from mi_transformer.moe import MoeNames


@attrs.define(eq=False)
class LayerNames:
    """Every hook name of one layer, built once at load (no string formatting per forward)."""

    resid_pre: str
    ln1_scale: str
    ln1_normalized: str
    attn: AttnNames
    ln1_post_scale: str
    ln1_post_normalized: str
    attn_out: str
    resid_mid: str
    ln2_scale: str
    ln2_normalized: str
    mlp_pre: str
    mlp_post: str
    ln2_post_scale: str
    ln2_post_normalized: str
    mlp_out: str
    resid_post: str
    attn_in: str = ""  # attn.hook_in: ln1's output after gain/bias
    mlp_in: str = ""  # mlp.hook_in
    tl_attn_in: str = ""  # hook_attn_in: resid_pre per head [b, s, heads, d_model] (opt-in)
    q_input: str = ""  # hook_q_input / hook_k_input / hook_v_input (opt-in)
    k_input: str = ""
    v_input: str = ""
    tl_mlp_in: str = ""  # hook_mlp_in: resid_mid before ln2
    mlp_pre_linear: str = ""  # mlp.hook_pre_linear (gated MLPs)
    moe: MoeNames | None = None  # router and expert points of a mixture-of-experts layer
    rotary: bool = True  # False: no hook_rot_q / hook_rot_k (no rotary, or a NoPE layer)
    mixer_in: str = ""  # a plugin mixer's input point (the norm's output), e.g. ssm.hook_in
    mixer_out: str = ""  # hook_mixer_out: what a plugin mixer adds to the residual stream
    qk_norm: bool = False  # this layer has q/k norms (q_ln / k_ln points)
    has_mlp: bool = True  # False: the layer ends after attention (no MLP points)
    # -- Gemma-4 / Gemma-3n --
    has_kv: bool = True  # False: keys and values shared from an earlier layer (no k / v points)
    head_inputs: bool = True  # hook_attn_in / hook_q_input / ... (not with shared k or k = v)
    moe_beside: bool = False  # an MoE beside the dense MLP (both sets of points)
    laurel: bool = False
    ple: bool = False  # the per-layer-input branch
    altup: bool = False  # AltUp's stream points
    ple_in: str = ""  # hook_per_layer_input [b, s, p]
    ple_out: str = ""  # hook_per_layer_out [b, s, d_model]
    laurel_out: str = ""  # laurel.hook_out
    streams_pre: str = ""  # altup.hook_streams_pre [b, s, n, d_model]
    predictions: str = ""  # altup.hook_predictions
    activated: str = ""  # altup.hook_activated [b, s, d_model]
    corrected: str = ""  # altup.hook_corrected
    streams_post: str = ""  # altup.hook_streams_post
    dense_out: str = ""  # mlp.hook_dense_out: the dense MLP's post-normed output (beside MoE)
    moe_in: str = ""  # mlp.hook_moe_in: the experts' (normed) input
    moe_out: str = ""  # mlp.hook_moe_out: the experts' post-normed output

    @classmethod
    def of(cls, i: int) -> "LayerNames":
        p = f"blocks.{i}."
        a = p + "attn."
        return cls(
            resid_pre=p + "hook_resid_pre", ln1_scale=p + "ln1.hook_scale",
            ln1_normalized=p + "ln1.hook_normalized",
            attn=AttnNames(q=a + "hook_q", k=a + "hook_k", v=a + "hook_v", rot_q=a + "hook_rot_q",
                           rot_k=a + "hook_rot_k", scores=a + "hook_attn_scores",
                           pattern=a + "hook_pattern", z=a + "hook_z", result=a + "hook_result",
                           q_scale=a + "q_ln.hook_scale", k_scale=a + "k_ln.hook_scale",
                           gate=a + "hook_gate",
                           sinks=a + "hook_sinks", q_latent=a + "hook_q_latent",
                           kv_latent=a + "hook_kv_latent"),
            ln1_post_scale=p + "ln1_post.hook_scale",
            ln1_post_normalized=p + "ln1_post.hook_normalized",
            attn_out=p + "hook_attn_out", resid_mid=p + "hook_resid_mid",
            ln2_scale=p + "ln2.hook_scale", ln2_normalized=p + "ln2.hook_normalized",
            mlp_pre=p + "mlp.hook_pre", mlp_post=p + "mlp.hook_post",
            ln2_post_scale=p + "ln2_post.hook_scale",
            ln2_post_normalized=p + "ln2_post.hook_normalized",
            mlp_out=p + "hook_mlp_out", resid_post=p + "hook_resid_post",
            attn_in=a + "hook_in", mlp_in=p + "mlp.hook_in", tl_attn_in=p + "hook_attn_in",
            q_input=p + "hook_q_input", k_input=p + "hook_k_input", v_input=p + "hook_v_input",
            tl_mlp_in=p + "hook_mlp_in", mlp_pre_linear=p + "mlp.hook_pre_linear",
            ple_in=p + "hook_per_layer_input", ple_out=p + "hook_per_layer_out",
            laurel_out=p + "laurel.hook_out", streams_pre=p + "altup.hook_streams_pre",
            predictions=p + "altup.hook_predictions", activated=p + "altup.hook_activated",
            corrected=p + "altup.hook_corrected", streams_post=p + "altup.hook_streams_post",
            dense_out=p + "mlp.hook_dense_out", moe_in=p + "mlp.hook_moe_in",
            moe_out=p + "mlp.hook_moe_out")

    def in_order(self, c: TransformerConfig) -> list[str]:
        """This layer's points in execution order, only those the family has a value for:
        no ``hook_rot_*`` without rotary, no ``hook_resid_mid`` in a parallel block, no
        ``ln2`` points when the block shares one norm."""
        a = self.attn
        out = [self.streams_pre] if self.altup else []
        out += [self.resid_pre] + ([self.predictions] if self.altup else [])
        if self.head_inputs:  # latent attention, shared keys or keys as values: none
            out += [self.tl_attn_in, self.q_input, self.k_input, self.v_input]
        out += [self.ln1_scale, self.ln1_normalized] if c.pre_norms else []
        out += [self.attn_in]
        if c.mla is not None:
            out += [a.q_latent] if c.mla.q_lora_rank is not None else []
            out += [a.kv_latent]
        kv = self.has_kv  # a layer that shares an earlier layer's keys: no k / v points
        if c.qk_norm_after_rope:  # the q/k norms read the rotated q / k (Llama 4)
            out += [a.q, a.k, a.v] if kv else [a.q]
            out += [a.q_scale] if self.qk_norm else []
            out += [a.rot_q] if self.rotary else []
            out += [a.k_scale] if self.qk_norm and kv else []
            out += [a.rot_k] if self.rotary and kv else []
        else:
            out += ([a.q_scale, a.k_scale] if kv else [a.q_scale]) if self.qk_norm else []
            out += [a.q, a.k, a.v] if kv else [a.q]
            out += ([a.rot_q, a.rot_k] if kv else [a.rot_q]) if self.rotary else []
        out += [a.sinks] if c.attn_sinks else []
        out += [a.scores, a.pattern, a.z] + ([a.gate] if c.attn_output_gate else [])
        out += [a.result]
        out += [self.ln1_post_scale, self.ln1_post_normalized] if c.post_norms else []
        out += [self.attn_out]
        if not self.has_mlp:
            return out + [self.resid_post]
        out += [self.laurel_out] if self.laurel else []
        out += [self.resid_mid] if c.block is BlockLayout.SEQUENTIAL or self.laurel else []
        out += self.mlp_points(c)
        if self.altup:
            out += [self.activated, self.corrected]
        out += [self.ple_in, self.ple_out] if self.ple else []
        out += [self.streams_post] if self.altup else []
        return out + [self.resid_post]

    def mlp_points(self, c: TransformerConfig) -> list[str]:
        """The MLP half's points in execution order, ``hook_mlp_in`` to ``hook_mlp_out``."""
        out = [self.tl_mlp_in]
        if c.block is not BlockLayout.PARALLEL_SHARED_NORM and c.pre_norms:
            out += [self.ln2_scale, self.ln2_normalized]
        out += [self.mlp_in]
        if self.moe is not None and not self.moe_beside:
            out += self.moe.in_order(bool(c.moe and c.moe.shared_expert_size))
        else:
            out += [self.mlp_pre]
            out += [self.mlp_pre_linear] if c.mlp_layout is not MlpLayout.PLAIN else []
            out += [self.mlp_post]
        if self.moe is not None and self.moe_beside:  # Gemma-4: the experts beside the MLP
            out += [self.dense_out, self.moe_in]
            out += self.moe.in_order(bool(c.moe and c.moe.shared_expert_size))
            out += [self.moe_out]
        out += [self.ln2_post_scale, self.ln2_post_normalized] if c.post_norms else []
        return out + [self.mlp_out]
