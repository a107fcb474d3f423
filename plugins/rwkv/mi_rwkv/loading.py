"""Checkpoint loading: HF-format RWKV-6 and fla-format RWKV-7 safetensors (never pickles), and
llama.cpp's GGUF files of both (:mod:`mi_rwkv.gguf`: the same tensor names and config keys)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from mi_core.plugin import (
    ConfigError, ModelSource, SafetensorsCheckpoint, UnsupportedModelError, WeightLoadError,
    read_config, safetensors_header,
)

from mi_rwkv.config import RwkvConfig, check_size, parse_v6, parse_v7, rwkv_version
from mi_rwkv.model import RwkvBackend
from mi_rwkv.v6 import V6Layer, v6_expected_shapes
from mi_rwkv.v7 import V7Layer, v7_expected_shapes


#: safetensors dtypes of float weights; anything else (integer, bool) is refused.
_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape without leading singleton axes ((1, 1, C) and (C,) are the same vector)."""
    s = tuple(shape)
    while len(s) > 1 and s[0] == 1:
        s = s[1:]
    return s


def _listing(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (and {len(names) - limit} more)" if len(names) > limit else "")


def _account(ckpt: Any, expected: dict[str, tuple[int, ...]],
             heads: tuple[str, ...], cfg: RwkvConfig, where: str) -> None:
    """Every tensor is expected (or a head), none is missing or mis-shaped, all are floats.

    One WeightLoadError names every culprit; leftovers are reported whatever the config's
    layer count says (a config with fewer layers than the checkpoint is an error).
    """
    files = ", ".join(map(str, ckpt.files))
    missing = [n for n in expected if n not in ckpt]
    wrong = [f"{n}: {list(ckpt.shapes[n])} != expected {list(s)}" for n, s in expected.items()
             if n in ckpt and _squeezed(ckpt.shapes[n]) != _squeezed(s)]
    extra = sorted(n for n in ckpt.names() if n not in expected and n not in heads)
    parts = ([f"missing tensors: {_listing(missing)}"] if missing else []) + \
            ([f"mis-shaped tensors: {'; '.join(wrong)}"] if wrong else []) + \
            ([f"tensors an RWKV-{cfg.version} model with num_hidden_layers={cfg.num_layers} "
              f"({where}) does not use: {_listing(extra)}"] if extra else [])
    if parts:
        raise WeightLoadError(f"{files}: " + " | ".join(parts))
    if not isinstance(ckpt, SafetensorsCheckpoint):  # GGUF: dequantised to float32
        return
    not_float = [f"{n} ({meta['dtype']})" for f in ckpt.files
                 for n, meta in safetensors_header(f).items()
                 if n != "__metadata__" and meta.get("dtype") not in _FLOAT_DTYPES]
    if not_float:
        raise WeightLoadError(f"{files}: non-float tensors {_listing(not_float)}: mi-rwkv reads "
                              "float weights only (quantised checkpoints are not supported)")


def _open(src: ModelSource, version: int) -> tuple[Any, dict, str, Any]:
    """(checkpoint, config dict, where the config came from, tokenizer or None): a
    safetensors directory, or a GGUF file (:func:`mi_rwkv.gguf.read_rwkv_gguf`)."""
    if src.path.is_file() and src.path.suffix.lower() == ".gguf":
        from mi_rwkv.gguf import read_rwkv_gguf

        found, raw, tensors, tok = read_rwkv_gguf(src.path)
        if found != version:
            raise UnsupportedModelError(f"{src.path}: an RWKV-{found} GGUF, not RWKV-{version}")
        return tensors, raw, f"{src.path} (config from GGUF metadata)", tok
    path = src.path if src.path.is_dir() else src.path.parent
    cfg = src.config if src.config is not None else read_config(path)
    if cfg is None:
        raise ConfigError(f"{path}: no config.json")
    ckpt = SafetensorsCheckpoint.from_directory(path)
    found = rwkv_version(cfg, ckpt.names())
    if found != version:
        raise UnsupportedModelError(f"{path}: model_type {cfg.get('model_type')!r} is not "
                                    f"RWKV-{version}")
    return ckpt, cfg, str(path / "config.json"), None


def _reader(ckpt: Any, device: torch.device, dtype: torch.dtype
            ) -> Callable[[str], torch.Tensor]:
    """Tensor name -> tensor cast to `dtype` on `device`; the checkpoint checks each one as
    it is read (integer dtype, NaN / inf after the cast) and names it."""
    return lambda name: ckpt.get(name, dtype=dtype, device=device)


def _head(ckpt: Any, cfg: RwkvConfig, names: tuple[str, ...],
          embed: torch.Tensor, get: Callable[[str], torch.Tensor]) -> torch.Tensor:
    """The output head: the checkpoint's, or the embedding when tied (a stored head that
    differs from the embedding while tie_word_embeddings is true is refused)."""
    present = [n for n in names if n in ckpt]
    if len(present) > 1:
        raise WeightLoadError(f"{', '.join(map(str, ckpt.files))}: two output heads "
                              f"{present}; expected one")
    if present:
        n = present[0]
        w = get(n)
        if tuple(w.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise WeightLoadError(f"tensor {n!r} has shape {list(w.shape)}, expected "
                                  f"{[cfg.vocab_size, cfg.hidden_size]}")
        if cfg.tie_word_embeddings and not torch.equal(w, embed):
            raise WeightLoadError(f"{', '.join(map(str, ckpt.files))}: config.json ties the head "
                                  f"to the embedding (tie_word_embeddings: true) but {n!r} "
                                  "differs from it; fix the config or drop the tensor")
        return w
    if cfg.tie_word_embeddings:
        return embed
    raise WeightLoadError(f"{', '.join(map(str, ckpt.files))}: missing tensors: {names[0]} "
                          "(and tie_word_embeddings is false)")


def load_rwkv6(src: ModelSource, device: torch.device, dtype: torch.dtype) -> RwkvBackend:
    """An HF-format RWKV-6 directory (``rwkv.blocks.{i}.attention.*``) as a backend."""
    ckpt, raw, where, tok = _open(src, 6)
    cfg = parse_v6(raw, ckpt.shapes, where)
    check_size(cfg, where, dtype, device)
    c, h, d = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    expected = {"rwkv.embeddings.weight": (cfg.vocab_size, c), "rwkv.blocks.0.pre_ln.weight": (c,),
                "rwkv.blocks.0.pre_ln.bias": (c,), "rwkv.ln_out.weight": (c,), "rwkv.ln_out.bias": (c,)}
    for i in range(cfg.num_layers):
        expected.update(v6_expected_shapes(f"rwkv.blocks.{i}.", c, h, d, cfg.intermediate_size,
                                           cfg.time_mix_rank, cfg.time_decay_rank))
    heads = ("head.weight",)
    _account(ckpt, expected, heads, cfg, where)
    get = _reader(ckpt, device, dtype)
    layers = []
    for i in range(cfg.num_layers):
        p = f"rwkv.blocks.{i}."
        w = {n[len(p):]: get(n) for n in expected if n.startswith(p)}
        layers.append(V6Layer(w, h, d, cfg.group_norm_eps))
    embed = get("rwkv.embeddings.weight")
    backend = RwkvBackend("rwkv6", cfg, layers, embed,
                          (get("rwkv.blocks.0.pre_ln.weight"), get("rwkv.blocks.0.pre_ln.bias")),
                          (get("rwkv.ln_out.weight"), get("rwkv.ln_out.bias")),
                          _head(ckpt, cfg, heads, embed, get), device, dtype)
    backend.tokenizer = tok  # a GGUF's World vocabulary (None: found beside the checkpoint)
    return backend


def load_rwkv7(src: ModelSource, device: torch.device, dtype: torch.dtype) -> RwkvBackend:
    """An fla-format RWKV-7 directory (``model.layers.{i}.attn.*``) as a backend.

    Older checkpoints that store the six lerp coefficients as one ``attn.x_x`` (6, C)
    (order r, w, k, v, a, g) are migrated on load.
    """
    ckpt, raw, where, tok = _open(src, 7)
    cfg = parse_v7(raw, ckpt.shapes, where)
    check_size(cfg, where, dtype, device)
    c, h, d = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    expected = {"model.embeddings.weight": (cfg.vocab_size, c), "model.layers.0.pre_norm.weight": (c,),
                "model.layers.0.pre_norm.bias": (c,), "model.norm.weight": (c,), "model.norm.bias": (c,)}
    legacy: set[int] = set()
    for i in range(cfg.num_layers):
        block = v7_expected_shapes(f"model.layers.{i}.", i, cfg)
        xx = f"model.layers.{i}.attn.x_x"
        if xx in ckpt and f"model.layers.{i}.attn.x_r" not in ckpt:
            legacy.add(i)
            for n in "rwkvag":
                del block[f"model.layers.{i}.attn.x_{n}"]
            block[xx] = (6, c)
        expected.update(block)
    heads = ("lm_head.weight", "model.lm_head.weight")
    _account(ckpt, expected, heads, cfg, where)
    get = _reader(ckpt, device, dtype)
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        w = {n[len(p):]: get(n) for n in expected if n.startswith(p)}
        if i in legacy:
            x6 = w.pop("attn.x_x")
            for j, n in enumerate("rwkvag"):
                w[f"attn.x_{n}"] = x6[j]
        layers.append(V7Layer(w, i, h, d, cfg.group_norm_eps))
    embed = get("model.embeddings.weight")
    backend = RwkvBackend("rwkv7", cfg, layers, embed,
                          (get("model.layers.0.pre_norm.weight"), get("model.layers.0.pre_norm.bias")),
                          (get("model.norm.weight"), get("model.norm.bias")),
                          _head(ckpt, cfg, heads, embed, get), device, dtype)
    backend.tokenizer = tok
    return backend
