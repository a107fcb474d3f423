"""mi-rwkv: RWKV-6 / RWKV-7 backend for mi-core with state interventions and the World tokenizer."""

__version__ = "0.1.0"
