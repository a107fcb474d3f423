"""RWKV-6 and RWKV-7 GGUF files (llama.cpp's ``rwkv6`` / ``rwkv7``), read through the kernel
ring :mod:`mi_core.gguf` (header, tensor table, dequantisation: the same reader mi-transformer
uses; plugins do not import each other) into the HF-format RWKV-6 / fla-format RWKV-7 tensor
names and config keys the safetensors loaders read, so a GGUF gives the numbers of the
checkpoint it was converted from.

What llama.cpp's converter (``conversion/rwkv.py``: ``Rwkv6Model``, ``Rwkv7Model``) changes,
undone here:

- RWKV-6: the five ddlerp coefficients ``time_maa_{w,k,v,r,g}`` stacked as one
  ``time_mix_lerp_fused`` [5, 1, 1, C] (order w, k, v, r, g); the lerps and ``time_decay``
  squeezed to [C]; ``time_maa_w1`` and both decay LoRAs transposed, ``time_maa_w2``
  [5, R, C] stored [5, C, R]; ``time_mix_output`` and ``channel_mix_value`` of layer i divided
  by 2^(i // ``rescale_every``) (llama.cpp halves the residual every that many layers
  instead): multiplied back, exactly (powers of two). The GroupNorm's ``head_size_divisor`` is
  not written: llama.cpp's built-in eps 64e-5 is 1e-5 x 8^2, transformers' default 8.
- RWKV-7 (fla format): the six lerps ``x_{r,w,k,v,a,g}`` stacked as ``time_mix_lerp_fused``
  [6, 1, 1, C] (order r, w, k, v, a, g); ``r_k`` [H, D] flattened; everything else squeezed
  (``ffn.x_k``, ``k_k``, ``k_a``, the LoRA biases as ``time_mix_{w,a,v}0``); layer 0's
  ``time_mix_v0/1/2`` are the converter's copies of its ``a`` LoRA (layer 0 has none):
  dropped. The LoRA ranks are metadata (``attention.*_lora_rank``), checked against the
  tensors by the config parser.
- Both: tensor names of ``gguf``'s map (``blk.{i}.time_mix_*``, ``channel_mix_*``,
  ``attn_norm`` / ``attn_norm_2``, ``token_embd_norm`` for the embedding's pre-norm); sizes
  as ``embedding_length``, ``block_count``, ``wkv.head_size``, ``feed_forward_length``,
  ``attention.layer_norm_epsilon``; the World vocabulary as ``tokenizer.ggml.tokens``
  (``tokenizer.ggml.model`` "rwkv": id 0 ``<s>``, each token's bytes as Python's escaped
  ``repr`` text, "[PADi]" after the last), rebuilt as the World tokenizer.
"""

from __future__ import annotations

import codecs
import math
import re
from pathlib import Path
from typing import Any, Callable

import torch

from mi_core.plugin import ConfigError, UnsupportedModelError, WeightLoadError, checked_tensor

#: llama.cpp architecture -> RWKV generation
ARCHES = {"rwkv6": 6, "rwkv7": 7}
_UNUSED = 5  # gguf.TokenType.UNUSED: the padding tokens

Fix = Callable[[torch.Tensor], torch.Tensor]


def _row(c: int) -> Fix:
    return lambda t: t.reshape(1, 1, c)


_T: Fix = lambda t: t.t()  # noqa: E731
_SAME: Fix = lambda t: t  # noqa: E731


def _v6_layer(c: int) -> dict[str, tuple[str, Fix]]:
    """RWKV-6: GGUF ``module.suffix`` -> (HF name inside ``rwkv.blocks.{i}.``, inverse)."""
    a, f = "attention.", "feed_forward."
    out = {"attn_norm.weight": ("ln1.weight", _SAME), "attn_norm.bias": ("ln1.bias", _SAME),
           "attn_norm_2.weight": ("ln2.weight", _SAME), "attn_norm_2.bias": ("ln2.bias", _SAME),
           "time_mix_lerp_x.weight": (a + "time_maa_x", _row(c)),
           "time_mix_w1.weight": (a + "time_maa_w1", _T),
           "time_mix_w2.weight": (a + "time_maa_w2", lambda t: t.transpose(1, 2)),
           "time_mix_decay.weight": (a + "time_decay", _row(c)),
           "time_mix_decay_w1.weight": (a + "time_decay_w1", _T),
           "time_mix_decay_w2.weight": (a + "time_decay_w2", _T),
           "time_mix_first.weight": (a + "time_faaaa", _SAME),
           "time_mix_ln.weight": (a + "ln_x.weight", _SAME),
           "time_mix_ln.bias": (a + "ln_x.bias", _SAME),
           "channel_mix_lerp_k.weight": (f + "time_maa_k", _row(c)),
           "channel_mix_lerp_r.weight": (f + "time_maa_r", _row(c))}
    for n in ("receptance", "key", "value", "gate", "output"):
        out[f"time_mix_{n}.weight"] = (a + f"{n}.weight", _SAME)
    for n in ("key", "receptance", "value"):
        out[f"channel_mix_{n}.weight"] = (f + f"{n}.weight", _SAME)
    for n in "wkvrg":  # unfused, as one might write them
        out[f"time_mix_lerp_{n}.weight"] = (a + f"time_maa_{n}", _row(c))
    return out


def _v7_layer(c: int, heads: int, head_dim: int) -> dict[str, tuple[str, Fix]]:
    """RWKV-7: GGUF ``module.suffix`` -> (fla name inside ``model.layers.{i}.``, inverse)."""
    a = "attn."
    out = {"attn_norm.weight": ("attn_norm.weight", _SAME),
           "attn_norm.bias": ("attn_norm.bias", _SAME),
           "attn_norm_2.weight": ("ffn_norm.weight", _SAME),
           "attn_norm_2.bias": ("ffn_norm.bias", _SAME),
           "time_mix_k_k.weight": (a + "k_k", _SAME), "time_mix_k_a.weight": (a + "k_a", _SAME),
           "time_mix_r_k.weight": (a + "r_k", lambda t: t.reshape(heads, head_dim)),
           "time_mix_ln.weight": (a + "g_norm.weight", _SAME),
           "time_mix_ln.bias": (a + "g_norm.bias", _SAME),
           "channel_mix_lerp_k.weight": ("ffn.x_k", _SAME),
           "channel_mix_key.weight": ("ffn.key.weight", _SAME),
           "channel_mix_value.weight": ("ffn.value.weight", _SAME)}
    for g, n in (("receptance", "r"), ("key", "k"), ("value", "v"), ("output", "o")):
        out[f"time_mix_{g}.weight"] = (a + f"{n}_proj.weight", _SAME)
    for n in "wavg":
        out[f"time_mix_{n}1.weight"] = (a + f"{n}_lora.lora.0.weight", _SAME)
        out[f"time_mix_{n}2.weight"] = (a + f"{n}_lora.lora.2.weight", _SAME)
        if n != "g":
            out[f"time_mix_{n}0.weight"] = (a + f"{n}_lora.lora.2.bias", _SAME)
    return out


_GLOBALS = {
    6: {"token_embd.weight": "rwkv.embeddings.weight",
        "token_embd_norm.weight": "rwkv.blocks.0.pre_ln.weight",
        "token_embd_norm.bias": "rwkv.blocks.0.pre_ln.bias",
        "output_norm.weight": "rwkv.ln_out.weight", "output_norm.bias": "rwkv.ln_out.bias",
        "output.weight": "head.weight"},
    7: {"token_embd.weight": "model.embeddings.weight",
        "token_embd_norm.weight": "model.layers.0.pre_norm.weight",
        "token_embd_norm.bias": "model.layers.0.pre_norm.bias",
        "output_norm.weight": "model.norm.weight", "output_norm.bias": "model.norm.bias",
        "output.weight": "lm_head.weight"}}
#: the fused lerps: GGUF order of the HF names
_LERPS = {6: ("attention.time_maa_", "wkvrg"), 7: ("attn.x_", "rwkvag")}
_PREFIX = {6: "rwkv.blocks.{i}.", 7: "model.layers.{i}."}


class _Meta:
    """Typed reads of the GGUF metadata: a wrong type is a ConfigError naming the key."""

    def __init__(self, md: dict[str, Any], arch: str, path: Path) -> None:
        self.md, self.arch, self.path = md, arch, path

    def bad(self, key: str, v: Any, what: str) -> ConfigError:
        return ConfigError(f"{self.path}: GGUF metadata {key!r} = {v!r} ({type(v).__name__}): "
                           f"expected {what}")

    def int(self, key: str, default: Any = ..., *, minimum: int = 1) -> Any:
        k = f"{self.arch}.{key}"
        v = self.md.get(k)
        if v is None:
            if default is ...:
                raise ConfigError(f"{self.path}: GGUF metadata lacks required key {k!r}")
            return default
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.bad(k, v, f"an integer >= {minimum}")
        return v

    def float(self, key: str, default: float) -> float:
        k = f"{self.arch}.{key}"
        v = self.md.get(k, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v <= 0:
            raise self.bad(k, v, "a finite number > 0")
        return float(v)


def rwkv_config(header: Any) -> tuple[int, dict[str, Any]]:
    """(generation, config.json-style dict: HF ``Rwkv6Config`` / fla ``RWKV7Config`` keys) of a
    GGUF header; the vocabulary is the embedding's rows."""
    arch = header.metadata.get("general.architecture")
    if arch not in ARCHES:
        raise UnsupportedModelError(f"{header.path}: GGUF architecture {arch!r} is not RWKV-6 "
                                    f"or RWKV-7 (mi-rwkv reads {', '.join(ARCHES)})")
    version, m = ARCHES[arch], _Meta(header.metadata, arch, header.path)
    hidden = m.int("embedding_length")
    emb = next((t.shape for t in header.tensors if t.name == "token_embd.weight"), None)
    if emb is None or len(emb) != 2 or emb[1] != hidden:
        raise ConfigError(f"{header.path}: token_embd.weight of shape {emb} does not give the "
                          f"vocabulary of an embedding of width {hidden}")
    cfg: dict[str, Any] = {
        "model_type": arch, "vocab_size": emb[0], "hidden_size": hidden,
        "num_hidden_layers": m.int("block_count"), "attention_hidden_size": hidden,
        "intermediate_size": m.int("feed_forward_length"),
        "tie_word_embeddings": all(t.name != "output.weight" for t in header.tensors)}
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        v = header.metadata.get(f"tokenizer.ggml.{key}")
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise m.bad(f"tokenizer.ggml.{key}", v, "an integer >= 0")
            cfg[hf] = v
    eps = m.float("attention.layer_norm_epsilon", 1e-5)
    if version == 6:
        cfg.update(head_size=m.int("wkv.head_size"), layer_norm_epsilon=eps,
                   head_size_divisor=8,  # llama.cpp's built-in GroupNorm eps 64e-5
                   rescale_every=m.int("rescale_every_n_layers", 0, minimum=0))
    else:
        cfg.update(head_dim=m.int("wkv.head_size"), norm_eps=eps,
                   decay_low_rank_dim=m.int("attention.decay_lora_rank", None),
                   a_low_rank_dim=m.int("attention.iclr_lora_rank", None),
                   v_low_rank_dim=m.int("attention.value_residual_mix_lora_rank", None),
                   gate_low_rank_dim=m.int("attention.gate_lora_rank", None))
    return version, {k: v for k, v in cfg.items() if v is not None}


class GgufTensors:
    """A GGUF's tensors under the safetensors checkpoint's names (what the RWKV loaders read:
    ``names()``, ``shapes``, ``get``, ``in``), dequantised to float32 at load."""

    def __init__(self, path: Path, tensors: dict[str, torch.Tensor]) -> None:
        self.files, self.tensors = [path], tensors
        self.shapes = {k: tuple(v.shape) for k, v in tensors.items()}

    def names(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None) -> torch.Tensor:
        if name not in self.tensors:
            raise WeightLoadError(f"{self.files[0]}: tensor {name!r} not found")
        return checked_tensor(self.tensors[name], name, str(self.files[0]), dtype, device)


def _rename(version: int, cfg: dict[str, Any], name: str, t: torch.Tensor, path: Path
            ) -> list[tuple[str, torch.Tensor]]:
    """One GGUF tensor -> [(checkpoint name, tensor)] (several for the fused lerps, none for
    RWKV-7's dummy layer-0 value LoRA)."""
    c = cfg["hidden_size"]
    glob = _GLOBALS[version].get(name)
    if glob is not None:
        return [(glob, t)]
    parts = name.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
        raise UnsupportedModelError(f"{path}: tensor {name!r} has no RWKV-{version} equivalent")
    i, rest = int(parts[1]), parts[2]
    prefix = _PREFIX[version].format(i=i)
    if rest == "time_mix_lerp_fused.weight":
        lead, order = _LERPS[version]
        if t.numel() != len(order) * c:
            raise WeightLoadError(f"{path}: tensor {name!r} of shape {list(t.shape)} is not "
                                  f"{len(order)} lerps of width {c}")
        return [(f"{prefix}{lead}{n}", row.reshape(1, 1, c))
                for n, row in zip(order, t.reshape(len(order), c))]
    if version == 7 and i == 0 and rest.startswith("time_mix_v") and rest[10:11] in "012":
        return []  # the converter's copy of layer 0's a LoRA ("easiest way to make llama happy")
    table = _v6_layer(c) if version == 6 else _v7_layer(c, c // cfg["head_dim"], cfg["head_dim"])
    if rest not in table:
        raise UnsupportedModelError(f"{path}: tensor {name!r} has no RWKV-{version} equivalent")
    hf, fix = table[rest]
    try:
        t = fix(t)
    except RuntimeError as e:  # a reshape that cannot be
        raise WeightLoadError(f"{path}: tensor {name!r} of shape {list(t.shape)}: {e}") from None
    every = cfg.get("rescale_every", 0)
    if version == 6 and every and rest in ("time_mix_output.weight", "channel_mix_value.weight"):
        t = t * 2.0 ** (i // every)  # Rwkv6Model divided them; exact (a power of two)
    return [(prefix + hf, t)]


def read_rwkv_gguf(path: Path) -> tuple[int, dict[str, Any], GgufTensors, Any]:
    """(generation, config dict, tensors under the safetensors names, World tokenizer or None)
    of an RWKV GGUF file; WeightLoadError / ConfigError / UnsupportedModelError naming the
    file, key or tensor."""
    from mi_core.gguf import iter_dequantized, read_gguf_header

    from mi_rwkv.config import check_size, parse_v6, parse_v7

    path = Path(path)
    header = read_gguf_header(path)
    version, cfg = rwkv_config(header)
    # before any tensor is read: a billion layers is refused, and the weights must fit in
    # RAM, where they are dequantised (float32)
    where = f"{path} (config from GGUF metadata)"
    check_size((parse_v6 if version == 6 else parse_v7)(cfg, {}, where), where, torch.float32,
               torch.device("cpu"))
    tensors: dict[str, torch.Tensor] = {}
    for t, arr in iter_dequantized(header):
        for name, w in _rename(version, cfg, t.name, torch.from_numpy(arr), path):
            if name in tensors:
                raise WeightLoadError(f"{path}: two GGUF tensors give {name!r}")
            tensors[name] = w
    return version, cfg, GgufTensors(path, tensors), world_tokenizer(header)


def world_tokenizer(header: Any) -> Any:
    """The World tokenizer of ``tokenizer.ggml.tokens`` when ``tokenizer.ggml.model`` is
    "rwkv" (else None): id 0 is end-of-text, "[PADi]" padding is not a token."""
    from mi_core.plugin import TokenizerError

    from mi_rwkv.tokenizer import WorldTokenizer

    md = header.metadata
    if md.get("tokenizer.ggml.model") != "rwkv":
        return None
    tokens = md.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(isinstance(x, str) for x in tokens):
        raise TokenizerError(f"{header.path}: tokenizer.ggml.tokens is not a list of strings")
    types = md.get("tokenizer.ggml.token_type")
    if not (isinstance(types, list) and len(types) == len(tokens)):
        types = None
    out: dict[int, bytes] = {}
    for i, text in enumerate(tokens[1:], 1):
        if (types[i] == _UNUSED) if types else re.fullmatch(r"\[PAD\d+\]", text):
            continue  # the converter's padding up to the embedding's rows
        try:
            out[i] = codecs.escape_decode(text.encode("utf-8"))[0]  # type: ignore[attr-defined]
        except ValueError as exc:
            raise TokenizerError(f"{header.path}: token {i} {text!r} is not an escaped byte "
                                 f"string: {exc}") from exc
    return WorldTokenizer(out, source=str(header.path))
