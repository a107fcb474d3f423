"""The SAE file formats mi-sae reads: SAELens, Gemma Scope (1 and 2), sparsify, Llama Scope."""
