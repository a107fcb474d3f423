"""Shared by the examples: load the model named on the command line, or the embedded SmolLM2."""

from __future__ import annotations

import sys

import mi_core as mi
from mi_core.cli.analysis import load_model


def model_from_argv() -> mi.MIModel:
    """``python examples/X.py [MODEL]``: MODEL is a directory, hub id or .gguf file."""
    return load_model(sys.argv[1] if len(sys.argv) > 1 else None)
