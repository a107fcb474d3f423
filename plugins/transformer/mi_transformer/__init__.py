"""mi-transformer: Generic decoder-only transformer backend for mi-core (LLaMA, Qwen, Gemma, Phi-3, StarCoder2, Mistral, GGUF)."""

__version__ = "0.1.0"
