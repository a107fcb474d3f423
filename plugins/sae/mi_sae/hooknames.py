"""SAE hook names, as each format stores them, -> the HookPoint holding the values the SAE
was trained on.

SAELens and Llama Scope store TransformerLens names; mi-core's names mean what they mean
in TransformerLens, so those are ours verbatim (``blocks.3.hook_resid_post``,
``blocks.3.attn.hook_z``, ``blocks.3.ln2.hook_normalized`` = x / scale before the gain,
``blocks.3.hook_mlp_in``). Gemma Scope 2 and sparsify store
HuggingFace module paths: the output of the norm in front of the MLP (after its gain) is
the MLP's input, ``blocks.N.mlp.hook_in``. Anything else is parsed as-is and checked
against the model when the SAE is spliced.
"""

from __future__ import annotations

import re

from mi_core.plugin import HookPoint

#: HuggingFace module paths (Gemma Scope 2 ``hf_hook_point_in``, sparsify hookpoints).
_HF_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^(?:model\.)?layers\.(\d+)(?:\.output)?$"), "hook_resid_post"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.self_attn\.o_proj\.input$"), "attn.hook_z"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.self_attn(?:\.output)?$"), "hook_attn_out"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.pre_feedforward_layernorm\.output$"), "mlp.hook_in"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.post_feedforward_layernorm\.output$"),
     "hook_mlp_out"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.mlp(?:\.output)?$"), "hook_mlp_out"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.mlp\.input$"), "mlp.hook_in"),
]

#: ``post_attention_layernorm`` is the norm in front of the MLP in LLaMA-style models but
#: the attention's post-norm in Gemma 2 / 3 (whose output mi-core calls hook_attn_out).
_POST_ATTENTION_NORM = re.compile(r"^(?:model\.)?layers\.(\d+)\.post_attention_layernorm\.output$")


def tl_to_hook_point(name: str) -> HookPoint:
    """A TransformerLens hook name (as in SAELens ``hook_name``) as our HookPoint: the same
    name, with the same value (``hook_mlp_in`` / ``hook_attn_in`` included: an intervention
    there changes only the sublayer's input, as in TransformerLens; a backend without them
    refuses the SAE's splice by name)."""
    return HookPoint.parse(name)


def hf_to_hook_point(name: str, post_norms: bool = False) -> HookPoint | None:
    """A HuggingFace module path (``model.layers.5.output``, ``layers.5.mlp``) or None.

    `post_norms`: the model has attention / MLP post-norms (Gemma 2 / 3), which decides
    what ``post_attention_layernorm.output`` holds.
    """
    if name in ("embed_tokens", "model.embed_tokens", "model.embed_tokens.output"):
        return HookPoint.embed()
    m = _POST_ATTENTION_NORM.match(name)
    if m:
        return HookPoint.layer_point(int(m.group(1)), "hook_attn_out" if post_norms else "mlp.hook_in")
    for pat, suffix in _HF_PATTERNS:
        m = pat.match(name)
        if m:
            return HookPoint.layer_point(int(m.group(1)), suffix)
    return None
