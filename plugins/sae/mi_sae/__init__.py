"""mi-sae: Sparse autoencoders for mi-core (SAELens, Gemma Scope, sparsify, Llama Scope formats)."""

__version__ = "0.1.0"
