"""mi-rwkv: RWKV-6 / RWKV-7 backend for mi-core with state interventions and the World tokenizer."""

from mi_rwkv.config import RwkvConfig
from mi_rwkv.effective_attn import effective_attention_v6, effective_attention_v7
from mi_rwkv.loading import load_rwkv6, load_rwkv7
from mi_rwkv.model import RwkvBackend, RwkvState
from mi_core.interp.state import (  # re-exported: the core holds them (backend-agnostic)
    StateAblationResult,
    StateSteeringResult,
    run_state_knockout,
    run_state_steering,
)
from mi_rwkv.tokenizer import WorldTokenizer

__version__ = "0.1.0"

__all__ = [
    "RwkvBackend", "RwkvConfig", "RwkvState", "StateAblationResult", "StateSteeringResult",
    "WorldTokenizer", "effective_attention_v6", "effective_attention_v7", "load_rwkv6",
    "load_rwkv7", "run_state_knockout", "run_state_steering",
]
