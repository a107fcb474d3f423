"""The tokenizer of a GGUF file: a ``tokenizers.Tokenizer`` from ``tokenizer.ggml.*``, built
the way transformers builds it from the same file (byte-level BPE for
``tokenizer.ggml.model == "gpt2"``, sentencepiece BPE with byte fallback for ``"llama"``), so
ids agree."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from mi_core.plugin import HFTokenizer, TokenizerError

from mi_transformer.gguf.header import GgufHeader


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
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
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


def _byte_level(md: dict[str, Any], tokens: list[str], path: Path
                ) -> tuple[Any, dict[str, int], set[str]]:
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


def _sentencepiece(md: dict[str, Any], tokens: list[str], path: Path
                   ) -> tuple[Any, dict[str, int], None]:
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
