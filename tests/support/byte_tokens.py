"""GPT-2's byte alphabet for the tiny GGUF vocabularies, written independently of
mi_transformer.gguf (which has its own copy) so the tests do not check the code with itself."""

from __future__ import annotations


def gpt2_byte_tokens(n: int = 256) -> list[str]:
    """The first `n` of GPT-2's 256 single-byte tokens, in byte order (a valid byte-level
    BPE vocabulary with no merges)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))][:n]
