"""mi-transformer's part of the ``mi`` command (entry-point group ``mi_cli``): what a
checkpoint declares, read from its config.json or GGUF header without loading a weight, so
``mi`` can check layer / head / position ranges at once and ``mi check`` reads the header
before it says "supported". Nothing is imported at module level beyond the CLI SDK (torch
loads only when the hook runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mi_cli.plugin import command_impl


def _info(cfg: Any, tokenizer: Any, what: str) -> dict[str, Any]:
    return {"num_layers": int(cfg.num_layers), "num_heads": int(cfg.num_heads),
            "num_kv_heads": int(cfg.num_kv_heads), "vocab_size": int(cfg.vocab_size),
            "tokenizer": tokenizer, "what": f"{what}, {cfg.num_layers} layers, "
                                             f"{cfg.num_heads} heads"}


def gguf_info(path: Path) -> dict[str, Any]:
    """A GGUF file's dimensions and tokenizer from its header (WeightLoadError for a file
    that is not GGUF, e.g. text with a .gguf name; ConfigError for bad metadata)."""
    from mi_transformer.config import parse_config
    from mi_transformer.gguf.arches import gguf_arch, hf_config
    from mi_transformer.gguf.header import read_gguf_header
    from mi_transformer.gguf.tokenizer import gguf_tokenizer

    header = read_gguf_header(path)
    arch = gguf_arch(header)  # UnsupportedModelError for an architecture we do not read
    cfg = parse_config(hf_config(header), f"{path} (config from GGUF metadata)")
    return _info(cfg, gguf_tokenizer(header), f"GGUF {arch.model_type}")


def directory_info(path: Path) -> dict[str, Any] | None:
    """A checkpoint directory's dimensions (config.json) and tokenizer (tokenizer.json);
    None when its config is not one this backend parses."""
    from mi_core.plugin import HFTokenizer, MIError, read_config
    from mi_transformer.config import parse_config

    cfg = read_config(path)
    if not isinstance(cfg, dict):
        return None
    try:
        parsed = parse_config(cfg, str(path / "config.json"))
    except MIError:
        return None  # another backend's checkpoint, or one detection refuses with the reason
    tok = HFTokenizer.from_directory(path) if (path / "tokenizer.json").is_file() else None
    return _info(parsed, tok, f"model_type {cfg.get('model_type')!r}")


@command_impl
def mi_checkpoint_info(source: str) -> dict[str, Any] | None:
    path = Path(source)
    if path.is_file() and path.suffix.lower() == ".gguf":
        from mi_core.gguf import gguf_architecture
        from mi_transformer.gguf import GGUF_ARCHES

        arch = gguf_architecture(path)  # WeightLoadError for a file that is not GGUF
        if arch is not None and arch not in GGUF_ARCHES:
            return None  # another plugin's architecture (mi-rwkv's rwkv6 / rwkv7) or none's
        return gguf_info(path)
    if path.is_dir() and (path / "config.json").is_file():
        return directory_info(path)
    return None
