"""The GGUF file format (ggml's): the header (metadata key/values and the tensor table),
parsed with a small reader of its own, and tensor-by-tensor dequantisation from a read-only
memory map.

A ring of the kernel, as :mod:`mi_core.recurrence` is: not loaded by ``import mi_core`` (it
needs numpy, and the optional ``gguf`` package to dequantise), imported by every backend
plugin that reads GGUF files (plugins must not import each other, so the reader lives here).
Each plugin's detection reads ``general.architecture`` with :func:`gguf_architecture` (the
first key/values only) and claims the architectures it implements.

``gguf.GGUFReader`` builds one numpy view per metadata string, which takes seconds on a
49k-token vocabulary; the format is simple, and the result is checked against ``GGUFReader``
in the tests. Truncated files are detected here (the table must fit the file).
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path
from typing import Any, Iterator

import attrs
import numpy as np

from mi_core.plugin import WeightLoadError

GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# GGUF metadata value types (gguf.GGUFValueType): id -> struct format (scalars only).
_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}
_NUMPY_DTYPE = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
                6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


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


def _open_map(path: Path) -> "mmap.mmap":
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise WeightLoadError(f"{path}: truncated GGUF file ({size} bytes)")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise WeightLoadError(f"{path}: cannot open GGUF file: {exc}") from exc


def gguf_architecture(path: Path) -> str | None:
    """``general.architecture`` of the GGUF file `path` (None when it has none or the version
    is unknown), reading the key/values only up to it (converters write it first): what
    detection needs. WeightLoadError for a file that is not GGUF or is truncated there."""
    path = Path(path)
    buf = _open_map(path)
    try:
        cur = _Cursor(buf, path)
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise WeightLoadError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
        cur.take(4)
        if cur.scalar("<I") not in (2, 3):
            return None
        cur.scalar("<Q")
        for _ in range(cur.scalar("<Q")):
            key = cur.string()
            value = cur.value(cur.scalar("<I"), key)
            if key == "general.architecture":
                return value if isinstance(value, str) else None
        return None
    finally:
        buf.close()


def read_gguf_header(path: Path) -> GgufHeader:
    """Parse a GGUF file's metadata and tensor table (no tensor data is read).

    Raises WeightLoadError for a file that is not GGUF, an unsupported version, or a
    truncated header / data section.
    """
    path = Path(path)
    buf = _open_map(path)
    size = len(buf)
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
