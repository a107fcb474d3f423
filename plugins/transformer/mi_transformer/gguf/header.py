"""The GGUF header reader and dequantisation: the kernel ring :mod:`mi_core.gguf`, which
mi-rwkv's GGUF files are read with too, re-exported under the names mi_transformer.gguf
always had."""

from mi_core.gguf import (  # noqa: F401
    GGUF_MAGIC, GgufHeader, GgufTensorInfo, _quant_type, gguf_architecture, iter_dequantized,
    read_gguf_header, tensor_nbytes,
)
