"""SmolLM2 (the embedded GGUF) saved as an HF safetensors directory, once per test process.

Shared by test_gguf.py and test_tl_parity.py (a plain module: both import it; the directory is
written by ``GgufCheckpoint.save_pretrained`` and removed at interpreter exit).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from mi_transformer.gguf import GgufCheckpoint, read_gguf

_DIRS: dict[Path, Path] = {}


def smollm2_hf_dir(gguf_path: Path, ckpt: GgufCheckpoint | None = None) -> Path:
    """config.json + model.safetensors (F32) + tokenizer files of `gguf_path`, cached."""
    if gguf_path not in _DIRS:
        d = Path(tempfile.mkdtemp(prefix="mi-smollm2-hf-"))
        atexit.register(shutil.rmtree, d, True)
        (ckpt if ckpt is not None else read_gguf(gguf_path)).save_pretrained(d)
        _DIRS[gguf_path] = d
    return _DIRS[gguf_path]
