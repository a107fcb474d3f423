"""The views' plugin: every interactive page of :mod:`mi_core.viz`, registered by name.

Results draw themselves through this registry (``result.to_html(path)`` calls
``mi_core.plugins.view(name)``), so the analyses never import the views.
"""

from __future__ import annotations

from mi_core.plugin import ViewSpec, plugin_impl
from mi_core.viz import attention, effects, features, graph, heads, lens, patching


@plugin_impl
def mi_register_views() -> list[ViewSpec]:
    return [
        ViewSpec("attention", attention.attention_html, "every head of a layer, hover a token"),
        ViewSpec("effective_attention", attention.effective_attention_html,
                 "a recurrent layer's effective attention (|A| row-normalised), every head"),
        ViewSpec("logit_lens", lens.logit_lens_html, "lens points x positions, top-k on hover"),
        ViewSpec("patching", patching.patching_html, "a patching grid, normalised and raw metric"),
        ViewSpec("ablation", effects.ablation_html, "next-token distribution, knocked out"),
        ViewSpec("steering", effects.steering_html, "next-token distribution, steered"),
        ViewSpec("comparison", effects.comparison_html, "two next-token distributions"),
        ViewSpec("dose_response", effects.dose_response_html, "a steering sweep"),
        ViewSpec("attribution_graph", graph.attribution_graph_html,
                 "an attribution graph with pruning sliders"),
        ViewSpec("feature_activations", features.feature_activations_html,
                 "features over tokens"),
        ViewSpec("sparse_activations", features.sparse_activations_html,
                 "sparse feature activations over tokens"),
        ViewSpec("head_scores", heads.head_scores_html,
                 "previous-token, duplicate-token and induction scores per head"),
    ]
