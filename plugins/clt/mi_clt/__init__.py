"""mi-clt: cross-layer transcoders (circuit-tracer format), interventions and attribution graphs."""

from mi_clt.clt import CrossLayerTranscoder
from mi_clt.format import read_clt_layout

__version__ = "0.1.0"

__all__ = ["CrossLayerTranscoder", "read_clt_layout", "__version__"]
