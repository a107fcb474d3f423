"""SAEs that live in a subfolder of a hub repository (Gemma Scope, Llama Scope, sparsify).

``mi_core.load_dictionary`` takes ``org/name`` ids (files at the repository root); this
fetches only ``<subfolder>/<format files>`` with huggingface_hub (its cache, progress bars
and ``HF_HUB_OFFLINE``) and loads the folder through the same format detection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mi_core import plugins
from mi_core.dictionaries import load_dictionary
from mi_core.errors import DictionaryError


def load_from_hub(repo_id: str, subfolder: str | None = None, revision: str | None = None,
                  device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                  format: str | None = None) -> Any:
    """Download `repo_id`/`subfolder` (format files only) and load it; DictionaryError if
    it is neither cached (offline) nor reachable."""
    from huggingface_hub import snapshot_download

    patterns = sorted({p for f in plugins.dictionary_formats() for p in f.hub_patterns})
    sub = (subfolder or "").strip("/")
    allow = [f"{sub}/{p}" if sub else p for p in patterns]
    try:
        root = Path(snapshot_download(repo_id=repo_id, revision=revision, allow_patterns=allow))
    except Exception as exc:  # offline without cache, missing repo, network errors
        raise DictionaryError(f"{repo_id}/{sub}: cannot fetch from the hub or the local HF "
                              f"cache: {exc}") from exc
    folder = root / sub if sub else root
    if not folder.exists():
        raise DictionaryError(f"{repo_id}: no subfolder {sub!r} in the downloaded snapshot {root}")
    return load_dictionary(folder, device=device, dtype=dtype, format=format)
