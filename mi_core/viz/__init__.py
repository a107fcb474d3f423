"""Interactive views: each function writes ONE self-contained HTML page (all JS and CSS
inline, the data embedded as JSON, nothing fetched; it opens from ``file://`` with no
network). The result classes have ``to_html(path)`` methods calling these, and the CLI
writes them for ``--plot OUT.html``. See docs/VIEWS.md.

- :func:`attention_html`: every head of a layer; hover a token to see what it attends to.
  :func:`effective_attention_html`: the same for a recurrent layer's effective attention.
- :func:`logit_lens_html`: lens points x positions; hover for top-k tokens and probabilities.
- :func:`patching_html`: a patching grid; hover for the normalised and raw metric.
- :func:`ablation_html`, :func:`steering_html`, :func:`comparison_html`: the next-token
  distribution before and after an intervention (effects are intervened - baseline).
- :func:`dose_response_html`: a steering sweep.
- :func:`attribution_graph_html`: an attribution graph with pruning sliders.
- :func:`feature_activations_html`, :func:`sparse_activations_html`: features over tokens.
- :func:`head_scores_html`: previous-token, duplicate-token and induction scores per head.

Every view validates its input (a ``ConfigError`` names the field), shows any text with its
invisible characters escaped, keeps NaN visible, and refuses sizes a browser cannot draw.
"""

from mi_core.viz.attention import attention_html, effective_attention_html
from mi_core.viz.effects import (
    ablation_html, comparison_html, dose_response_html, steering_html,
)
from mi_core.viz.features import feature_activations_html, sparse_activations_html
from mi_core.viz.graph import NODE_KINDS, attribution_graph_html
from mi_core.viz.heads import head_scores_html
from mi_core.viz.lens import logit_lens_html
from mi_core.viz.patching import patching_html

__all__ = [
    "NODE_KINDS", "ablation_html", "attention_html", "attribution_graph_html",
    "comparison_html", "dose_response_html", "effective_attention_html",
    "feature_activations_html", "head_scores_html", "logit_lens_html", "patching_html",
    "sparse_activations_html", "steering_html",
]
