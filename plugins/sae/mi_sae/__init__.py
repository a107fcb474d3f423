"""mi-sae: Sparse autoencoders for mi-core (SAELens, Gemma Scope, sparsify, Llama Scope formats).

Load through ``mi_core.load_dictionary(path_or_hub_id)``; the formats register via the
``mi_register_dictionary_formats`` plugin hook.
"""

from mi_sae.features import FeatureCapture, FeatureExample, capture_features, top_activating
from mi_sae.hub import load_from_hub
from mi_sae.metrics import ReconstructionMetrics, activation_metrics, evaluate
from mi_sae.sae import SaeConfig, SparseAutoencoder

__version__ = "0.1.0"

__all__ = [
    "FeatureCapture", "FeatureExample", "ReconstructionMetrics", "SaeConfig",
    "SparseAutoencoder", "activation_metrics", "capture_features", "evaluate", "load_from_hub",
    "top_activating",
]
