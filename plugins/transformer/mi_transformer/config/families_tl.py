"""``mi_tl_hooked_transformer``: the checkpoint mi-transformer writes for
``mi_core.tl.HookedTransformer(cfg)`` (:mod:`mi_transformer.tl_config`), a plugin-internal
``model_type`` no published checkpoint carries. Its ``config.json`` holds TransformerLens'
own ``HookedTransformerConfig`` fields, under TransformerLens' names, and its tensors
LLaMA's names (``lm_head.bias`` for TransformerLens' ``b_U``; ``model.embed_positions`` for
``W_pos``); the parser maps the fields to the generic axes. Only the shapes whose arithmetic
is TransformerLens' exactly are accepted (tl_config refuses the rest by field before
writing; this parser refuses the same values by key)."""

from __future__ import annotations

from mi_transformer.config.axes import (MlpLayout, NormType, Positions, RopeConfig,
                                        RopeLayout, TransformerConfig)
from mi_transformer.config.common import _activation
from mi_transformer.config.reader import ConfigReader

MODEL_TYPE = "mi_tl_hooked_transformer"
#: every key the parser reads (TransformerLens' field names)
READS = frozenset({
    "n_layers", "d_model", "d_head", "n_heads", "n_key_value_heads", "d_mlp", "d_vocab",
    "n_ctx", "act_fn", "eps", "normalization_type", "attn_only", "positional_embedding_type",
    "rotary_dim", "rotary_base", "rotary_adjacent_pairs", "gated_mlp", "use_attn_scale",
    "scale_attn_by_inverse_layer_idx"})


def parse_mi_tl_hooked_transformer(r: ConfigReader) -> TransformerConfig:
    """TransformerLens' fields -> axes: norms before attention and MLP (``LN`` / ``RMS``; the
    ``Pre`` kinds are the same norms with gain 1 and bias 0 in the tensors), biases on
    q/k/v/o and a plain MLP (a gated MLP has none: TransformerLens adds ``b_in`` after the
    gate's product), the unembedding's bias, learned or rotary positions, and no MLP at all
    with ``attn_only``."""
    n, d, dh = r.int("n_layers"), r.int("d_model"), r.int("d_head")
    h = r.int("n_heads")
    kv = r.int("n_key_value_heads", None) or h
    attn_only = r.bool("attn_only", False)
    gated = r.bool("gated_mlp", False)
    norm = r.str("normalization_type", choices=("LN", "LNPre", "RMS", "RMSPre"))
    positions = r.str("positional_embedding_type", choices=("standard", "rotary"))
    layer_norm = norm.startswith("LN")
    base = dict(
        model_type=MODEL_TYPE, weight_names=MODEL_TYPE, vocab_size=r.int("d_vocab"),
        hidden_size=d, num_layers=n, num_heads=h, num_kv_heads=kv, head_dim=dh,
        # attn_only: no layer has an MLP (layer_mlp), so its width is never read
        intermediate_size=1 if attn_only else r.int("d_mlp"),
        norm_type=NormType.LAYER_NORM if layer_norm else NormType.RMS, norm_bias=layer_norm,
        norm_eps=r.float("eps", gt=0), activation=_activation(r, "act_fn", "gelu_new"),
        mlp_layout=MlpLayout.GATED if gated else MlpLayout.PLAIN, qkv_bias=True, o_bias=True,
        mlp_bias=not gated, lm_head_bias=True, tie_word_embeddings=False,
        attn_scaled=r.bool("use_attn_scale", True),
        attn_scale_by_layer=r.bool("scale_attn_by_inverse_layer_idx", False),
        layer_mlp=(False,) * n if attn_only else (), max_positions=r.int("n_ctx"),
        layer_rope=(0,) * n, layer_windows=(None,) * n)
    if positions == "standard":
        return TransformerConfig(positions=Positions.LEARNED, **base)
    rot = r.int("rotary_dim", None) or dh
    if rot > dh or rot % 2:
        raise r.bad("rotary_dim", rot, f"an even number <= d_head = {dh}")
    adjacent = r.bool("rotary_adjacent_pairs", False)
    return TransformerConfig(
        ropes=(RopeConfig(theta=r.float("rotary_base", 10000.0, gt=0)),),
        rotary_dim=0 if rot == dh else rot,
        rope_layout=RopeLayout.INTERLEAVED if adjacent else RopeLayout.HALF, **base)
