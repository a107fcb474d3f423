"""Which plugin loads a checkpoint: source resolution, detection, compatibility reports.

Every plugin is asked through ``mi_detect_backend`` (config.json and tensor names only; no
weights are read); the best score wins.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from mi_core import plugins
from mi_core.errors import MIError, TokenizerError
from mi_core.loading import (
    DEFAULT_HUB_PATTERNS, read_config, refuse_pickle, resolve_source, tensor_names_of,
)
from mi_core.registry import CompatibilityReport, Detection, ModelSource
from mi_core.tokenizer import HFTokenizer, MITokenizer


def source_of(source: str | os.PathLike[str], revision: str | None = None) -> ModelSource:
    """`source` (hub id, directory or file) resolved, with its config and tensor names."""
    patterns = DEFAULT_HUB_PATTERNS + plugins.hub_file_patterns()
    path = resolve_source(source, patterns, revision=revision)
    refuse_pickle(path)
    if path.is_dir():
        names, shapes = tensor_names_of(path)
        return ModelSource(path=path, config=read_config(path), tensor_names=names,
                           tensor_shapes=shapes)
    return ModelSource(path=path)


def detections(src: ModelSource) -> list[Detection]:
    """What every plugin says about `src`; a plugin that crashes is reported, not raised."""
    out: list[Detection] = []
    for plugin_name, result in plugins.call_per_plugin("mi_detect_backend", catch=True,
                                                       source=src):
        if isinstance(result, Exception):  # a plugin bug: reported, not a raw traceback
            out.append(Detection("?", 0.0, f"detection failed on {src.path}: "
                                 f"{type(result).__name__}: {result}", plugin=plugin_name))
            continue
        items = result if isinstance(result, (list, tuple)) else [result]
        for d in items:
            if d is not None:
                if not d.plugin:
                    d = attrs.evolve(d, plugin=plugin_name)
                out.append(d)
    return out


def report(source: str, src: ModelSource, dets: list[Detection]) -> CompatibilityReport:
    ok = [d for d in dets if d.ok]
    best = max(ok, key=lambda d: d.score) if ok else None
    mt = (src.config or {}).get("model_type") if src.config else None
    return CompatibilityReport(source=source, model_type=mt, supported=best is not None,
                               backend=best.backend if best else None, detections=dets,
                               gguf_architecture=None if src.config is not None else next(
                                   (d.gguf_architecture for d in dets if d.gguf_architecture),
                                   None))  # a GGUF file, as a plugin that reads it said


def check_compatibility(source: str | os.PathLike[str]) -> CompatibilityReport:
    """Ask every plugin about `source` without loading weights."""
    src = source_of(source)
    return report(os.fspath(source), src, detections(src))


def load_tokenizer(path: Path) -> MITokenizer | None:
    """The tokenizer beside a checkpoint: a plugin's (``mi_register_tokenizers``) when one
    recognises the directory, else ``tokenizer.json`` through HuggingFace `tokenizers`."""
    directory = path if path.is_dir() else path.parent
    for spec in plugins.tokenizer_specs():
        try:
            if spec.detect(directory):
                return spec.load(directory)
        except MIError:
            raise
        except Exception as exc:  # a plugin's loader failing on this directory's files
            raise TokenizerError(f"{directory}: tokenizer {spec.name!r} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
    return HFTokenizer.from_directory(directory) if path.is_dir() else None
