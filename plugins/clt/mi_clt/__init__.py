"""mi-clt: Cross-layer transcoders and attribution graphs for mi-core (circuit-tracer format)."""

__version__ = "0.1.0"
