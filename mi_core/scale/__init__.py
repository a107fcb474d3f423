"""Experiments at scale: resumable sweeps (:func:`run_sweep`, :func:`load_sweep`) and
activation stores (:func:`cache_activations`, :class:`ActivationStore`), local by default,
in worker processes, or on Ray (see docs/SCALE.md)."""

from mi_core.scale._common import StoreError, SweepError
from mi_core.scale.activations import ActivationStore, CacheReport, cache_activations
from mi_core.scale.sweep import SweepRun, load_sweep, run_sweep

__all__ = ["ActivationStore", "CacheReport", "StoreError", "SweepError", "SweepRun",
           "cache_activations", "load_sweep", "run_sweep"]
