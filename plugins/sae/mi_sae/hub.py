"""SAEs that live in a subfolder of a hub repository (Gemma Scope, Llama Scope, sparsify).

The core resolves ``org/name/sub/folder`` ids itself (only that folder's files are fetched,
with huggingface_hub's cache, progress bars and ``HF_HUB_OFFLINE``); this is the same with the
repository and folder given apart, plus a revision, and every failure as a DictionaryError.
"""

from __future__ import annotations

from typing import Any

import torch

from mi_core.plugin import (
    DictionaryError, MIError, dictionary_formats, load_dictionary, resolve_source,
)


def load_from_hub(repo_id: str, subfolder: str | None = None, revision: str | None = None,
                  device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                  format: str | None = None) -> Any:
    """Download `repo_id`/`subfolder` (format files only) and load it; DictionaryError if
    it is neither cached (offline) nor reachable, or has no such folder."""
    patterns = sorted({p for f in dictionary_formats() for p in f.hub_patterns})
    sub = (subfolder or "").strip("/")
    source = f"{repo_id}/{sub}" if sub else repo_id
    try:
        folder = resolve_source(source, patterns, revision)
    except MIError as exc:  # offline without cache, missing repo or folder, network errors
        raise DictionaryError(f"{source}: {exc}") from exc
    return load_dictionary(folder, device=device, dtype=dtype, format=format)
