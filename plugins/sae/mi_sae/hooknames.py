"""SAE hook names (TransformerLens spelling, as SAE files store them) -> our HookPoints.

Most TransformerLens names are ours verbatim (``blocks.3.hook_resid_post``,
``blocks.3.attn.hook_z``). The few that differ are mapped here; anything else is parsed
as-is and checked against the model when the SAE is spliced.
"""

from __future__ import annotations

import re

from mi_core.hooks import HookPoint

#: TransformerLens suffixes with a different name (same tensor) in mi-core.
_TL_SUFFIX = {
    # TL's hook_mlp_in is the (un-normalised) residual entering ln2, i.e. resid_mid.
    "hook_mlp_in": "hook_resid_mid",
    # TL's hook_attn_in is the residual entering ln1, i.e. resid_pre.
    "hook_attn_in": "hook_resid_pre",
}

#: HuggingFace module paths (Gemma Scope 2 ``hf_hook_point_in``, sparsify hookpoints).
_HF_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^(?:model\.)?layers\.(\d+)(?:\.output)?$"), "hook_resid_post"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.self_attn\.o_proj\.input$"), "attn.hook_z"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.self_attn(?:\.output)?$"), "hook_attn_out"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.pre_feedforward_layernorm\.output$"),
     "ln2.hook_normalized"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.post_attention_layernorm\.output$"),
     "ln2.hook_normalized"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.post_feedforward_layernorm\.output$"),
     "hook_mlp_out"),
    (re.compile(r"^(?:model\.)?layers\.(\d+)\.mlp(?:\.output)?$"), "hook_mlp_out"),
]


def tl_to_hook_point(name: str) -> HookPoint:
    """A TransformerLens hook name (as in SAELens ``hook_name``) as our HookPoint."""
    m = re.match(r"^blocks\.(\d+)\.(.+)$", name)
    if m and m.group(2) in _TL_SUFFIX:
        return HookPoint.layer_point(int(m.group(1)), _TL_SUFFIX[m.group(2)])
    return HookPoint.parse(name)


def hf_to_hook_point(name: str) -> HookPoint | None:
    """A HuggingFace module path (``model.layers.5.output``, ``layers.5.mlp``) or None."""
    if name in ("embed_tokens", "model.embed_tokens", "model.embed_tokens.output"):
        return HookPoint.embed()
    for pat, suffix in _HF_PATTERNS:
        m = pat.match(name)
        if m:
            return HookPoint.layer_point(int(m.group(1)), suffix)
    return None
