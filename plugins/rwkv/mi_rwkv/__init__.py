"""mi-rwkv: RWKV-6 / RWKV-7 backend for mi-core with state interventions and the World tokenizer."""

from typing import Any

from mi_rwkv.config import RwkvConfig
from mi_rwkv.effective_attn import effective_attention_v6, effective_attention_v7
from mi_rwkv.loading import load_rwkv6, load_rwkv7
from mi_rwkv.model import RwkvBackend, RwkvState
from mi_rwkv.tokenizer import WorldTokenizer

__version__ = "0.1.0"

#: The state knockout / steering analyses live in mi-core's analyses (they work for any
#: backend with recurrent state); these names stay here as aliases, resolved on first use so
#: loading the backend does not load the analyses.
_ANALYSES = ("StateAblationResult", "StateSteeringResult", "run_state_knockout",
             "run_state_steering")


def __getattr__(name: str) -> Any:
    if name in _ANALYSES:
        from mi_core import interp

        return getattr(interp, name)
    raise AttributeError(f"module 'mi_rwkv' has no attribute {name!r}")


__all__ = [
    "RwkvBackend", "RwkvConfig", "RwkvState", "StateAblationResult", "StateSteeringResult",
    "WorldTokenizer", "effective_attention_v6", "effective_attention_v7", "load_rwkv6",
    "load_rwkv7", "run_state_knockout", "run_state_steering",
]
