"""mi-probing: linear probes on captured activations for mi-core.

Collect per-prompt activations (:func:`collect_activations`), train probes scored against
shuffled-label baselines (:func:`fit_probe`, :func:`probe_model` for many hook points),
plot the curve (:func:`plot_sweep`) and steer along a probe's direction
(:func:`probe_direction`, :func:`steer_with_probe`, :func:`dose_response`).
"""

from mi_probing.collect import ActivationSet, Position, collect_activations
from mi_probing.data import LabelledDataset, load_jsonl
from mi_probing.direction import (
    DoseResponse,
    dose_response,
    last_token_logit_diff,
    model_space_weights,
    probe_direction,
    steer_with_probe,
    steering_hooks,
)
from mi_probing.errors import ProbingError
from mi_probing.plot import plot_sweep
from mi_probing.probes import ProbeResult, ProbeScore, fit_probe
from mi_probing.sweep import (
    CurvePoint,
    SweepResult,
    expand_hooks,
    layer_hooks,
    probe_activations,
    probe_model,
)

__version__ = "0.1.0"

__all__ = [
    "ActivationSet", "CurvePoint", "DoseResponse", "LabelledDataset", "Position",
    "ProbeResult", "ProbeScore", "ProbingError", "SweepResult", "collect_activations",
    "dose_response", "expand_hooks", "fit_probe", "last_token_logit_diff", "layer_hooks",
    "load_jsonl", "model_space_weights", "plot_sweep", "probe_activations", "probe_direction",
    "probe_model", "steer_with_probe", "steering_hooks",
]
