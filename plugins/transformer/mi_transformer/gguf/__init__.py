"""GGUF (llama.cpp) checkpoints -> HF-named tensors, an HF config dict and a tokenizer.

What this does, in order:

1. Parse the GGUF header (metadata key/values and the tensor table) with a small reader of its
   own (the kernel ring :mod:`mi_core.gguf`, which mi-rwkv reads its GGUF files with too;
   re-exported by :mod:`~mi_transformer.gguf.header`). ``gguf.GGUFReader`` builds one numpy
   view per metadata string, which takes seconds on a 49k-token vocabulary; the format is
   simple, and the result is checked against ``GGUFReader`` in the tests. Truncated files are detected here (the table must fit the file).
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

Architectures: llama, qwen2, qwen3, gemma, gemma2, gemma3, phi2, phi3, starcoder2, olmo2
(OLMo-3 too, by its sliding-window metadata), olmoe, gpt2, gptneox, falcon, stablelm,
command-r, granite, qwen2moe, qwen3moe; exaone4, seed_oss, ernie4_5, glm4, glm4moe,
ernie4_5-moe, hunyuan-dense, apertus, olmo, smollm3
(:mod:`~mi_transformer.gguf.arches_recent`), gpt-oss, deepseek2, llama4
(:mod:`~mi_transformer.gguf.arches_moe2`), the state-space mamba, mamba2, jamba
(:mod:`~mi_transformer.gguf.arches_ssm`) and the hybrids granitehybrid, nemotron_h,
nemotron_h_moe, qwen3next, qwen35, qwen35moe (:mod:`~mi_transformer.gguf.arches_hybrid`),
falcon-h1, lfm2,
lfm2moe (:mod:`~mi_transformer.gguf.arches_hybrid2`), registered by
``checkpoint``, in :data:`GGUF_ARCHES`; gemma3n and gemma4
(:mod:`~mi_transformer.gguf.arches_gemma`, which ``checkpoint.read_gguf`` hands them to:
their metadata and tensors are mapped their own way); others are refused by name. Tensors a
converter split, re-laid out or stored as metadata are mapped back as data of each
architecture (``Join``, ``convert``,
``meta_tensors``). Metadata values of the wrong type are a ConfigError naming the key.

The modules, in import order (none imports a later one): :mod:`~mi_transformer.gguf.header`
(steps 1 and 2), :mod:`~mi_transformer.gguf.arches` (what each architecture changed, and its
metadata -> HF config, names -> slots: steps 3 and 4), :mod:`~mi_transformer.gguf.tokenizer`
(step 5) and :mod:`~mi_transformer.gguf.checkpoint` (:func:`read_gguf`, which runs them all,
and :func:`default_model_path`). Every name is importable from here.
"""

from mi_transformer.gguf.arches import (
    GGUF_ARCHES, GgufArch, Join, gguf_arch, hf_config, llama3_rope_from_factors, llama_config,
    mtp_layers, slot_of, unpermute_qk,
)
from mi_transformer.gguf.checkpoint import (
    SMOLLM2_FILE, GgufCheckpoint, default_model_path, read_gguf,
)
from mi_transformer.gguf.header import (
    GGUF_MAGIC, GgufHeader, GgufTensorInfo, iter_dequantized, read_gguf_header, tensor_nbytes,
)
from mi_transformer.gguf.tokenizer import gguf_tokenizer

__all__ = [
    "GGUF_ARCHES", "GGUF_MAGIC", "GgufArch", "GgufCheckpoint", "GgufHeader", "GgufTensorInfo",
    "Join", "SMOLLM2_FILE", "default_model_path", "gguf_arch", "gguf_tokenizer", "hf_config",
    "iter_dequantized", "llama3_rope_from_factors", "llama_config", "mtp_layers", "read_gguf",
    "read_gguf_header", "slot_of", "tensor_nbytes", "unpermute_qk",
]
