"""A TransformerLens ``HookedTransformer`` built offline from a LLaMA-architecture HF checkpoint
directory (the tiny test LLaMA, or SmolLM2 converted by :mod:`tests.support.smollm2_hf`): the
reference for the TransformerLens-compatibility tests.

The config is the one ``transformer_lens.loading_from_pretrained`` derives for
``LlamaForCausalLM`` (copied here because that path insists on an official hub name); the
weights go through TransformerLens' own ``convert_llama_weights`` and
``load_and_process_state_dict``, so processing (fold_ln, centring, value-bias folding) is
TransformerLens' code, not ours.
"""

from __future__ import annotations

from pathlib import Path

import torch


def hooked_llama(directory: str | Path, *, fold_ln: bool = False,
                 center_writing_weights: bool = False, center_unembed: bool = False,
                 fold_value_biases: bool = False, tokenizer=None,
                 default_prepend_bos: bool = False, n_layers: int | None = None,
                 **cfg_overrides):
    """HookedTransformer (float32, cpu) with the weights in `directory`. TransformerLens'
    own defaults are ``fold_ln=center_writing_weights=center_unembed=fold_value_biases=True``
    and ``default_prepend_bos=True`` (with a tokenizer). `n_layers`: its first blocks only,
    as TransformerLens' ``from_pretrained(first_n_layers=)`` (which sets ``cfg.n_layers`` and
    converts that many blocks)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(directory), torch_dtype=torch.float32)
    c = hf.config
    theta = getattr(c, "rope_theta", None) or (getattr(c, "rope_parameters", None) or {}).get(
        "rope_theta", 10000.0)
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size, d_head=c.hidden_size // c.num_attention_heads,
        n_heads=c.num_attention_heads, d_mlp=c.intermediate_size,
        n_layers=n_layers or c.num_hidden_layers,
        n_ctx=min(c.max_position_embeddings, 2048), eps=c.rms_norm_eps, d_vocab=c.vocab_size,
        act_fn=c.hidden_act,
        n_key_value_heads=(c.num_key_value_heads
                           if c.num_key_value_heads != c.num_attention_heads else None),
        normalization_type="RMS", positional_embedding_type="rotary",
        rotary_adjacent_pairs=False, rotary_dim=c.hidden_size // c.num_attention_heads,
        rotary_base=theta, final_rms=True, gated_mlp=True,
        original_architecture="LlamaForCausalLM", dtype=torch.float32, device="cpu",
        tokenizer_prepends_bos=False, default_prepend_bos=default_prepend_bos, **cfg_overrides)
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    state = convert_llama_weights(hf, cfg)
    model.load_and_process_state_dict(state, fold_ln=fold_ln,
                                      center_writing_weights=center_writing_weights,
                                      center_unembed=center_unembed,
                                      fold_value_biases=fold_value_biases)
    model.eval()
    return model


def hooked_gpt2(directory: str | Path, *, fold_ln: bool = False,
                center_writing_weights: bool = False, center_unembed: bool = False,
                fold_value_biases: bool = False, tokenizer=None,
                default_prepend_bos: bool = False, n_layers: int | None = None):
    """HookedTransformer of a GPT-2 checkpoint directory (LayerNorm with biases, learned
    positions, value biases): the config TransformerLens derives for GPT2LMHeadModel
    (`n_layers`: its first blocks, as in :func:`hooked_llama`)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(directory), torch_dtype=torch.float32)
    c = hf.config
    cfg = HookedTransformerConfig(
        d_model=c.n_embd, d_head=c.n_embd // c.n_head, n_heads=c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd, n_layers=n_layers or c.n_layer, n_ctx=c.n_positions,
        eps=c.layer_norm_epsilon, d_vocab=c.vocab_size, act_fn=c.activation_function,
        use_attn_scale=True, use_local_attn=False,
        scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx,
        normalization_type="LN", original_architecture="GPT2LMHeadModel",
        dtype=torch.float32, device="cpu", default_prepend_bos=default_prepend_bos)
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    model.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=fold_ln,
                                      center_writing_weights=center_writing_weights,
                                      center_unembed=center_unembed,
                                      fold_value_biases=fold_value_biases)
    model.eval()
    return model
