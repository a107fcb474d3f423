"""State-intervention results live in the core (backend-agnostic); re-exported here."""

from mi_core.interp.state import (  # noqa: F401
    StateAblationResult,
    StateSteeringResult,
    run_state_knockout,
    run_state_steering,
)
