"""mi-probing: linear probes on captured activations for mi-core.

Collect per-prompt activations (:func:`collect_activations`), train probes scored against
shuffled-label baselines (:func:`fit_probe`, :func:`probe_model` for many hook points),
plot the curve (:func:`plot_sweep`) and steer along a probe's direction
(:func:`probe_direction`, :func:`steer_with_probe`, :func:`probe_steering_spec` for the
interp toolkit's dose-response, :func:`mean_dose_response` over many prompts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Names load on first use: the CLI plugin hook imports this package, and `mi --help` should
# not pay for scikit-learn and matplotlib.
_LAZY = {
    "mi_probing.collect": ("ActivationSet", "Position", "collect_activations"),
    "mi_probing.data": ("LabelledDataset", "load_jsonl"),
    "mi_probing.direction": ("DoseResponse", "last_token_logit_diff", "mean_dose_response",
                             "model_space_weights", "probe_direction", "probe_steering_spec",
                             "steer_with_probe", "steering_hooks"),
    "mi_probing.errors": ("ProbingError",),
    "mi_probing.plot": ("plot_sweep",),
    "mi_probing.probes": ("ProbeResult", "ProbeScore", "check_labels", "fit_probe"),
    "mi_probing.sweep": ("CurvePoint", "SweepResult", "check_dataset", "expand_hooks",
                         "layer_hooks",
                         "probe_activations", "probe_model"),
}
_WHERE = {name: mod for mod, names in _LAZY.items() for name in names}

if TYPE_CHECKING:
    from mi_probing.collect import ActivationSet, Position, collect_activations
    from mi_probing.data import LabelledDataset, load_jsonl
    from mi_probing.direction import (
        DoseResponse, last_token_logit_diff, mean_dose_response, model_space_weights,
        probe_direction, probe_steering_spec, steer_with_probe, steering_hooks,
    )
    from mi_probing.errors import ProbingError
    from mi_probing.plot import plot_sweep
    from mi_probing.probes import ProbeResult, ProbeScore, check_labels, fit_probe
    from mi_probing.sweep import (
        CurvePoint, SweepResult, check_dataset, expand_hooks, layer_hooks, probe_activations,
        probe_model,
    )


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'mi_probing' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_WHERE))


__version__ = "0.1.0"

__all__ = [
    "ActivationSet", "CurvePoint", "DoseResponse", "LabelledDataset", "Position",
    "ProbeResult", "ProbeScore", "ProbingError", "SweepResult", "check_dataset",
    "check_labels", "collect_activations", "expand_hooks", "fit_probe",
    "last_token_logit_diff", "layer_hooks", "load_jsonl", "mean_dose_response",
    "model_space_weights", "plot_sweep", "probe_activations", "probe_direction", "probe_model",
    "probe_steering_spec", "steer_with_probe", "steering_hooks",
]
