"""Each family's checkpoint tensor names as data: one :class:`NameTable` per naming scheme,
in :data:`NAME_TABLES` (chosen by ``TransformerConfig.weight_names``). A new family whose
checkpoint names its modules differently adds a table here; :mod:`mi_transformer.weights`
turns a config and its table into the tensors the checkpoint must hold."""

from __future__ import annotations

import attrs


@attrs.frozen
class NameTable:
    """One family's checkpoint names (module names; ``.weight`` / ``.bias`` are appended).

    Per-layer names are relative to `layer` (``{i}`` is the layer index). A slot a family
    does not have is never looked up (e.g. `ln2` in a shared-norm parallel block). `conv1d`:
    every linear weight is stored [in, out] (GPT-2's Conv1D) and is transposed on load.
    `base_prefix`: some hub checkpoints store the base model without it (GPT-2's
    ``h.0.attn...`` for ``transformer.h.0.attn...``); both spellings load. `renamed`: (part
    of a name here, another spelling of it) pairs for checkpoints that name a module another
    way the reference reads too (transformers' renamings on load: Nemotron-H's ``model.``
    for ``backbone.``), the first occurrence replaced; a tensor stored under both spellings
    is refused (the other is unexpected). `ignore`: regexes of tensors that are known not to
    be weights (rotary caches, causal-mask buffers).
    """

    embed: str = "model.embed_tokens"
    pos_embed: str = ""
    final_norm: str = "model.norm"
    lm_head: str = "lm_head"
    layer: str = "model.layers.{i}."
    ln1: str = "input_layernorm"
    ln2: str = "post_attention_layernorm"
    ln1_post: str = ""
    ln2_post: str = ""
    q: str = "self_attn.q_proj"
    k: str = "self_attn.k_proj"
    v: str = "self_attn.v_proj"
    qkv: str = "self_attn.qkv_proj"
    o: str = "self_attn.o_proj"
    q_norm: str = "self_attn.q_norm"
    k_norm: str = "self_attn.k_norm"
    mlp_in: str = "mlp.gate_proj"  # gate (gated MLP) or the first linear (plain)
    mlp_up: str = "mlp.up_proj"
    mlp_gate_up: str = "mlp.gate_up_proj"
    mlp_out: str = "mlp.down_proj"
    mlp_act: str = "mlp.act_fn"  # a learned activation's parameters (xIELU)
    attn: str = "self_attn"  # the attention module (MLA's projections and gpt-oss's sinks)
    conv1d: bool = False
    base_prefix: str = ""
    renamed: tuple[tuple[str, str], ...] = ()
    ignore: tuple[str, ...] = (r"rotary_emb\.inv_freq$",)
    mixer: str = "mixer"  # a non-attention mixer's module (its tensors: the MixerSpec's names)
    #: a shared attention block's module (Zamba2; mi_transformer.shared_block), in the first
    #: layer that uses each weight set; `shared_out`: each using layer's own projection;
    #: `shared_prefix`: where a layer with a shared block keeps its own norm and mixer
    shared: str = ""
    shared_out: str = ""
    shared_prefix: str = ""
    #: the text model's module, under which the global tensors of the per-layer inputs and
    #: AltUp's projections live (Gemma-3n / Gemma-4: ``model.`` or ``model.language_model.``)
    text_model: str = "model."


_CAUSAL_BUFFERS = (r"\.att(n|ention)\.(bias|masked_bias)$", r"rotary_emb\.inv_freq$")

#: weight_names -> table. Adding a family that names its tensors differently is one entry.
NAME_TABLES: dict[str, NameTable] = {
    "llama": NameTable(),
    "phi3": NameTable(),  # fused qkv_proj / gate_up_proj (QkvLayout / MlpLayout say which)
    "olmo2": NameTable(ln1_post="post_attention_layernorm",  # post-norms only
                       ln2_post="post_feedforward_layernorm"),
    "gemma2": NameTable(ln2="pre_feedforward_layernorm", ln1_post="post_attention_layernorm",
                        ln2_post="post_feedforward_layernorm"),
    "starcoder2": NameTable(mlp_in="mlp.c_fc", mlp_out="mlp.c_proj"),
    # Llama 4: the MLP (dense or MoE) is feed_forward; the multimodal checkpoint's language
    # model under language_model. (vision tower and projector ignored, text-only forward)
    "llama4": NameTable(mlp_in="feed_forward.gate_proj", mlp_up="feed_forward.up_proj",
                        mlp_out="feed_forward.down_proj"),
    "llama4_mm": NameTable(embed="language_model.model.embed_tokens",
                           final_norm="language_model.model.norm",
                           lm_head="language_model.lm_head",
                           layer="language_model.model.layers.{i}.",
                           mlp_in="feed_forward.gate_proj", mlp_up="feed_forward.up_proj",
                           mlp_out="feed_forward.down_proj",
                           ignore=(r"^vision_model\.", r"^multi_modal_projector\.",
                                   r"rotary_emb\.inv_freq$")),
    # the 2025 families (config/families_recent.py)
    "glm4": NameTable(ln1_post="post_self_attn_layernorm", ln2_post="post_mlp_layernorm"),
    "hunyuan": NameTable(q_norm="self_attn.query_layernorm", k_norm="self_attn.key_layernorm"),
    "apertus": NameTable(ln1="attention_layernorm", ln2="feedforward_layernorm",
                         mlp_in="mlp.up_proj"),
    # ERNIE-4.5 MoE: the published multi-token-prediction modules (mtp_*) are not run
    "ernie4_5_moe": NameTable(ignore=(r"(^|\.)mtp_", r"rotary_emb\.inv_freq$")),
    # Gemma 3 multimodal: the language model's tensors under language_model.; the vision
    # tower and projector are ignored (the forward is text-only)
    "gemma3_mm": NameTable(embed="language_model.model.embed_tokens",
                           final_norm="language_model.model.norm",
                           lm_head="language_model.lm_head",
                           layer="language_model.model.layers.{i}.",
                           ln2="pre_feedforward_layernorm", ln1_post="post_attention_layernorm",
                           ln2_post="post_feedforward_layernorm",
                           ignore=(r"^vision_tower\.", r"^multi_modal_projector\.",
                                   r"rotary_emb\.inv_freq$")),
    # Gemma-4 / Gemma-3n (config/families_gemma.py): Gemma 2's norms; their extra tensors
    # (per-layer inputs, AltUp, Laurel, the MoE beside the MLP) are named in per_layer.py,
    # altup.py and moe.py. The multimodal checkpoints: the language model under
    # model.language_model. (the towers and embedders ignored: the forward is text-only)
    "gemma4": NameTable(ln2="pre_feedforward_layernorm", ln1_post="post_attention_layernorm",
                        ln2_post="post_feedforward_layernorm"),
    "gemma3n": NameTable(ln2="pre_feedforward_layernorm", ln1_post="post_attention_layernorm",
                         ln2_post="post_feedforward_layernorm",
                         renamed=(("model.", "model.language_model."),)),  # (as Qwen3.5's)
    "gemma3n_mm": NameTable(embed="model.language_model.embed_tokens",
                            final_norm="model.language_model.norm",
                            layer="model.language_model.layers.{i}.",
                            ln2="pre_feedforward_layernorm",
                            ln1_post="post_attention_layernorm",
                            ln2_post="post_feedforward_layernorm",
                            text_model="model.language_model.",
                            ignore=(r"^model\.(vision_tower|audio_tower|embed_vision|"
                                    r"embed_audio)\.", r"rotary_emb\.inv_freq$")),
    "gemma4_mm": NameTable(embed="model.language_model.embed_tokens",
                           final_norm="model.language_model.norm",
                           layer="model.language_model.layers.{i}.",
                           ln2="pre_feedforward_layernorm", ln1_post="post_attention_layernorm",
                           ln2_post="post_feedforward_layernorm",
                           text_model="model.language_model.",
                           ignore=(r"^model\.(vision_tower|audio_tower|embed_vision|"
                                   r"embed_audio)\.", r"rotary_emb\.inv_freq$")),
    # StableLM-2-12B's per-head q/k LayerNorms: one tensor per head ({h})
    "stablelm": NameTable(q_norm="self_attn.q_layernorm.norms.{h}",
                          k_norm="self_attn.k_layernorm.norms.{h}"),
    # HookedTransformer(cfg)'s plugin-internal checkpoint (mi_transformer.tl_config): LLaMA's
    # names, learned positions (TransformerLens' W_pos) beside the token embedding
    "mi_tl_hooked_transformer": NameTable(pos_embed="model.embed_positions"),
    "gpt2": NameTable(embed="transformer.wte", pos_embed="transformer.wpe",
                      final_norm="transformer.ln_f", layer="transformer.h.{i}.", ln1="ln_1",
                      ln2="ln_2", qkv="attn.c_attn", o="attn.c_proj", mlp_in="mlp.c_fc",
                      mlp_out="mlp.c_proj", conv1d=True, base_prefix="transformer.",
                      ignore=_CAUSAL_BUFFERS),
    "gpt_neox": NameTable(embed="gpt_neox.embed_in", final_norm="gpt_neox.final_layer_norm",
                          lm_head="embed_out", layer="gpt_neox.layers.{i}.",
                          qkv="attention.query_key_value", o="attention.dense",
                          mlp_in="mlp.dense_h_to_4h", mlp_out="mlp.dense_4h_to_h",
                          ignore=_CAUSAL_BUFFERS),
    "gptj": NameTable(embed="transformer.wte", final_norm="transformer.ln_f",
                      layer="transformer.h.{i}.", ln1="ln_1", ln2="", q="attn.q_proj",
                      k="attn.k_proj", v="attn.v_proj", o="attn.out_proj", mlp_in="mlp.fc_in",
                      mlp_out="mlp.fc_out", ignore=_CAUSAL_BUFFERS),
    "phi": NameTable(final_norm="model.final_layernorm", ln2="", o="self_attn.dense",
                     mlp_in="mlp.fc1", mlp_out="mlp.fc2"),
    "opt": NameTable(embed="model.decoder.embed_tokens", pos_embed="model.decoder.embed_positions",
                     final_norm="model.decoder.final_layer_norm", layer="model.decoder.layers.{i}.",
                     ln1="self_attn_layer_norm", ln2="final_layer_norm", o="self_attn.out_proj",
                     mlp_in="fc1", mlp_out="fc2"),
    "falcon": NameTable(embed="transformer.word_embeddings", final_norm="transformer.ln_f",
                        layer="transformer.h.{i}.", ln1="input_layernorm",
                        ln2="post_attention_layernorm", qkv="self_attention.query_key_value",
                        o="self_attention.dense", mlp_in="mlp.dense_h_to_4h",
                        mlp_out="mlp.dense_4h_to_h"),
    # state-space families: one norm and a mixer per layer (mi_transformer.mixers)
    "mamba": NameTable(embed="backbone.embeddings", final_norm="backbone.norm_f",
                       layer="backbone.layers.{i}.", ln1="norm", ln2="", mixer="mixer"),
    # hybrids (mi_transformer.config.families_hybrid): mixer and attention layers, each
    # with an MLP (or MoE) after its own norm
    "jamba": NameTable(final_norm="model.final_layernorm", ln2="pre_ff_layernorm",
                       mlp_in="feed_forward.gate_proj", mlp_up="feed_forward.up_proj",
                       mlp_out="feed_forward.down_proj", mixer="mamba"),
    # Nemotron-H: one norm and one "mixer" module per layer, which is the Mamba-2 mixer, the
    # attention, the MLP or the mixture of experts (an MLP-only or MoE layer's norm is its
    # ln2); multi-token-prediction layers (mtp.*) are not part of the causal-LM forward
    # (transformers ignores them on load too)
    "nemotron_h": NameTable(embed="backbone.embeddings", final_norm="backbone.norm_f",
                            layer="backbone.layers.{i}.", ln1="norm", ln2="norm",
                            q="mixer.q_proj", k="mixer.k_proj", v="mixer.v_proj",
                            o="mixer.o_proj", mlp_in="mixer.up_proj", mlp_out="mixer.down_proj",
                            mixer="mixer", ignore=(r"(^|\.)mtp\.",),
                            renamed=(("backbone.", "model."),)),
    "granitemoehybrid": NameTable(mlp_gate_up="shared_mlp.input_linear",
                                  mlp_out="shared_mlp.output_linear", mixer="mamba"),
    # LFM2: the short convolution's tensors under conv.; attention's output is out_proj
    "lfm2": NameTable(final_norm="model.embedding_norm", ln1="operator_norm", ln2="ffn_norm",
                      o="self_attn.out_proj", q_norm="self_attn.q_layernorm",
                      k_norm="self_attn.k_layernorm", mlp_in="feed_forward.w1",
                      mlp_up="feed_forward.w3", mlp_out="feed_forward.w2", mixer="conv"),
    # linear-attention hybrids: the mixer's tensors under linear_attn. (Qwen3-Next, Qwen3.5)
    "qwen3_next": NameTable(mixer="linear_attn"),
    # Qwen3.5 (text, MoE text): the same names; the released multi-token-prediction block
    # (mtp.*) is not part of the causal-LM forward (transformers ignores it too)
    # (a text model transformers read from the multimodal checkpoint saves its tensors
    # under model.language_model. still: its prefix change, reverted on save)
    "qwen3_5": NameTable(mixer="linear_attn", ignore=(r"^mtp\.", r"rotary_emb\.inv_freq$"),
                         renamed=(("model.", "model.language_model."),)),
    # Qwen3.5 as released (multimodal): the language model under model.language_model., the
    # head at the top; the vision tower (model.visual.) and mtp.* are not loaded
    "qwen3_5_mm": NameTable(embed="model.language_model.embed_tokens",
                            final_norm="model.language_model.norm",
                            layer="model.language_model.layers.{i}.", mixer="linear_attn",
                            ignore=(r"^model\.visual\.", r"^mtp\.",
                                    r"rotary_emb\.inv_freq$")),
    # OLMo hybrid as saved: DeltaNet layers pre-norm (attention_layer_norm before the mixer,
    # feedforward_layer_norm before the MLP); attention layers post-norm only (OLMo2), their
    # post-attention norm saved as feedforward_layer_norm too (transformers' reverse renaming);
    # transformers' module names (input_layernorm, post_attention_layernorm) read too
    "olmo_hybrid": NameTable(ln1="attention_layer_norm", ln2="feedforward_layer_norm",
                             ln1_post="feedforward_layer_norm",
                             ln2_post="post_feedforward_layernorm", mixer="linear_attn",
                             renamed=(("attention_layer_norm", "input_layernorm"),
                                      ("feedforward_layer_norm", "post_attention_layernorm"))),
    # MiniMax: the lightning-attention mixer under self_attn. like attention
    "minimax": NameTable(mixer="self_attn"),
    # Zamba2: Mamba-2 layers; a layer with the shared block keeps its norm and mixer under
    # mamba_decoder., the block under shared_transformer. (first use of each weight set)
    "zamba2": NameTable(final_norm="model.final_layernorm", ln2="", mixer="mamba",
                        shared="shared_transformer", shared_out="linear",
                        shared_prefix="mamba_decoder."),
    "falcon_two_norms": NameTable(embed="transformer.word_embeddings",
                                  final_norm="transformer.ln_f", layer="transformer.h.{i}.",
                                  ln1="ln_attn", ln2="ln_mlp", qkv="self_attention.query_key_value",
                                  o="self_attention.dense", mlp_in="mlp.dense_h_to_4h",
                                  mlp_out="mlp.dense_4h_to_h"),
}
