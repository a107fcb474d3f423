"""mi-probing: Linear probes on captured activations for mi-core."""

__version__ = "0.1.0"
