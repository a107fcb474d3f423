"""mi-clt: cross-layer transcoders (circuit-tracer format), interventions and attribution graphs."""

from mi_clt.attribution import (AttributionEdge, AttributionGraph, attribute,
                                build_attribution_graph, extract_decoder_vectors,
                                score_features_by_decoder_projection)
from mi_clt.clt import CrossLayerTranscoder
from mi_clt.format import read_clt_layout
from mi_clt.graph import CircuitGraph, PruneResult
from mi_clt.interventions import (Injection, PositionSweepResult, cache_steering_vectors_all_downstream,
                                  position_sweep, prepare_hook_injection, suppress_and_inject,
                                  suppression_injections)

__version__ = "0.1.0"

__all__ = [
    "AttributionEdge", "AttributionGraph", "CircuitGraph", "CrossLayerTranscoder", "Injection",
    "PositionSweepResult", "PruneResult", "attribute", "build_attribution_graph",
    "cache_steering_vectors_all_downstream", "extract_decoder_vectors", "position_sweep",
    "prepare_hook_injection", "read_clt_layout", "score_features_by_decoder_projection",
    "suppress_and_inject", "suppression_injections", "__version__",
]
