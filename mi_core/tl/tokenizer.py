"""The tokenizer TransformerLens code reads as ``model.tokenizer``: the model's
:class:`mi_core.MITokenizer` behind the parts of HuggingFace's tokenizer interface that
TransformerLens and its users call (``tokenizer(texts, padding=True, return_tensors="pt")``,
``encode``, ``decode``, ``batch_decode``, ``bos_token_id``, ``pad_token_id``,
``padding_side``, ``apply_chat_template`` (:mod:`mi_core.tl.chat_template`), ...).

As TransformerLens' own tokenizer (``get_tokenizer_with_bos``), encoding with special tokens
starts with the BOS token whether or not the underlying tokenizer adds one; ``HookedTransformer``
removes it where ``prepend_bos=False`` asks. The pad token is the tokenizer's
(``tokenizer_config.json``'s ``pad_token`` next to a ``tokenizer.json``) or, as in
TransformerLens, the EOS token; a tokenizer without a BOS token uses EOS for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

from mi_core import HFTokenizer, InputError, MITokenizer, TokenizerError
from mi_core.tl import chat_template as _chat


class TLTokenizer:
    """A HuggingFace-style view of an :class:`mi_core.MITokenizer` (see the module doc)."""

    def __init__(self, tokenizer: MITokenizer, padding_side: str = "right",
                 name_or_path: str = "") -> None:
        self.inner = tokenizer
        self.name_or_path = name_or_path
        self.padding_side = padding_side
        eos = tokenizer.eos_token_id
        bos = tokenizer.bos_token_id
        if bos is None and eos is None:
            raise TokenizerError(f"{name_or_path}: the tokenizer has neither a BOS nor an EOS "
                                 f"token; TransformerLens' BOS handling needs one")
        self.eos_token_id: int = eos if eos is not None else bos  # type: ignore[assignment]
        self.bos_token_id: int = bos if bos is not None else self.eos_token_id
        pad = _pad_id(tokenizer)
        self.pad_token_id: int = pad if pad is not None else self.eos_token_id
        #: whether the underlying tokenizer adds BOS by itself (decided once, as TransformerLens)
        empty = tokenizer.encode("", add_special_tokens=True)
        self.adds_bos = bool(empty) and empty[0] == self.bos_token_id
        #: TransformerLens' tokenizer always adds BOS when encoding with special tokens
        self.add_bos_token = True
        config = _tokenizer_config(tokenizer)
        #: ``tokenizer_config.json``'s values (HuggingFace's default length when absent)
        self.model_max_length = int(config.get("model_max_length") or int(1e30))
        unk = config.get("unk_token")
        unk = unk.get("content") if isinstance(unk, dict) else unk
        self.unk_token: str | None = unk if isinstance(unk, str) else None

    # -- special tokens --------------------------------------------------------------------
    bos_token = property(lambda self: self.inner.decode([self.bos_token_id]))
    eos_token = property(lambda self: self.inner.decode([self.eos_token_id]))
    pad_token = property(lambda self: self.inner.decode([self.pad_token_id]))
    vocab_size = property(lambda self: self.inner.vocab_size)

    def __len__(self) -> int:
        return int(self.inner.vocab_size)

    # -- encoding --------------------------------------------------------------------------
    def ids(self, text: str, prepend_bos: bool) -> list[int]:
        """`text`'s ids with BOS first (`prepend_bos`) or without a BOS the tokenizer adds."""
        if not isinstance(text, str):
            raise InputError(f"text must be a str, got {type(text).__name__}")
        ids = list(self.inner.encode(text, add_special_tokens=True))
        if self.adds_bos:
            return ids if prepend_bos else ids[1:]
        return [self.bos_token_id] + ids if prepend_bos else ids

    def pad(self, rows: Sequence[Sequence[int]], side: str | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask) [batch, longest], padded on `side` with the pad token."""
        side = side or self.padding_side
        if side not in ("left", "right"):
            raise InputError(f"padding_side must be 'left' or 'right', got {side!r}")
        n = max((len(r) for r in rows), default=0)
        ids = torch.full((len(rows), n), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            where = slice(n - len(r), n) if side == "left" else slice(0, len(r))
            ids[i, where] = torch.tensor(list(r), dtype=torch.long)
            mask[i, where] = 1
        return ids, mask

    def __call__(self, text: str | Sequence[str], return_tensors: str | None = None,
                 padding: bool | str = False, truncation: bool = False,
                 max_length: int | None = None, add_special_tokens: bool = True,
                 **unused: Any) -> dict[str, Any]:
        """``{"input_ids": ..., "attention_mask": ...}`` as HuggingFace's tokenizer returns."""
        texts = [text] if isinstance(text, str) else list(text)
        rows = [self.ids(t, add_special_tokens) for t in texts]
        if truncation and max_length is not None:
            rows = [r[:max_length] for r in rows]
        if return_tensors is None and not padding:
            out = rows[0] if isinstance(text, str) else rows
            masks = [[1] * len(r) for r in rows]
            return {"input_ids": out, "attention_mask": masks[0] if isinstance(text, str)
                    else masks}
        if return_tensors not in (None, "pt"):
            raise InputError(f"return_tensors must be 'pt' or None, got {return_tensors!r}")
        if len({len(r) for r in rows}) > 1 and not padding:
            raise InputError("texts of different lengths need padding=True")
        ids, mask = self.pad(rows)
        return {"input_ids": ids, "attention_mask": mask}

    def encode(self, text: str, add_special_tokens: bool = True,
               return_tensors: str | None = None, **unused: Any) -> Any:
        ids = self.ids(text, add_special_tokens)
        return torch.tensor([ids], dtype=torch.long) if return_tensors == "pt" else ids

    # -- decoding --------------------------------------------------------------------------
    def decode(self, ids: Any, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool = False, **unused: Any) -> str:
        ids = _id_list(ids)
        if skip_special_tokens:
            inner = getattr(self.inner, "inner", None)  # a tokenizers.Tokenizer knows them all
            if isinstance(self.inner, HFTokenizer) and inner is not None:
                return inner.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined]
            special = {self.bos_token_id, self.eos_token_id, self.pad_token_id}
            ids = [i for i in ids if i not in special]
        return self.inner.decode(ids)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool = False, **unused: Any) -> list[str]:
        return [self.decode(s, skip_special_tokens) for s in sequences]

    @property
    def unk_token_id(self) -> int | None:
        return None if self.unk_token is None else self.convert_tokens_to_ids(self.unk_token)

    def _raw(self) -> Any:
        """The underlying ``tokenizers.Tokenizer`` (vocabulary entries as stored), if any."""
        inner = getattr(self.inner, "inner", None)
        return inner if inner is not None and hasattr(inner, "id_to_token") else None

    def convert_ids_to_tokens(self, ids: Any, skip_special_tokens: bool = False) -> Any:
        """Vocabulary entries as stored (``"Ġcat"`` for a byte-level BPE), as HuggingFace's;
        the decoded pieces where the tokenizer does not list its entries."""
        raw = self._raw()
        one = isinstance(ids, int)
        ids = _id_list(ids)
        if skip_special_tokens:
            special = {self.bos_token_id, self.eos_token_id, self.pad_token_id}
            ids = [i for i in ids if i not in special]
        out = [raw.id_to_token(i) for i in ids] if raw is not None else \
            list(self.inner.to_str_tokens(ids))
        return out[0] if one else out

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        """Vocabulary entries -> ids (None for an entry not in the vocabulary, as the unknown
        token is where there is one)."""
        vocab = self.get_vocab()
        unk = vocab.get(self.unk_token) if self.unk_token is not None else None
        if isinstance(tokens, str):
            return vocab.get(tokens, unk)
        return [vocab.get(t, unk) for t in tokens]

    def tokenize(self, text: str, add_special_tokens: bool = False, **unused: Any
                 ) -> list[str]:
        """`text` as vocabulary entries (no BOS unless `add_special_tokens`)."""
        return self.convert_ids_to_tokens(self.ids(text, add_special_tokens))

    def get_vocab(self) -> dict[str, int]:
        inner = getattr(self.inner, "inner", None)
        if inner is None or not hasattr(inner, "get_vocab"):
            raise TokenizerError(f"{self.name_or_path}: this tokenizer does not list its vocabulary")
        return dict(inner.get_vocab(with_added_tokens=True))

    vocab = property(get_vocab)

    # -- chat templates (mi_core.tl.chat_template) -----------------------------------------
    @property
    def chat_template(self) -> str | dict[str, str] | None:
        """The tokenizer's chat template (a string; {name: template} for several; None), read
        once from its files; assignable, as HuggingFace's."""
        if not hasattr(self, "_chat_template"):
            self._chat_template = _chat.read_chat_template(self.inner)
        return self._chat_template

    @chat_template.setter
    def chat_template(self, value: str | dict[str, str] | None) -> None:
        self._chat_template = _chat._parse(value, "chat_template")

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """``{"bos_token": ..., "eos_token": ..., "unk_token": ..., "pad_token": ...}`` as
        TransformerLens' tokenizer has them (BOS and pad fall back to EOS)."""
        out = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        if self.unk_token is not None:
            out["unk_token"] = self.unk_token
        return {**out, "pad_token": self.pad_token}

    def get_chat_template(self, chat_template: str | None = None, tools: Any = None) -> str:
        """The template :meth:`apply_chat_template` renders (HuggingFace's choice: a name of
        one of several, or a template; ``tool_use`` of several when tools are given)."""
        return _chat.select_template(self.chat_template, chat_template, tools)

    def apply_chat_template(self, conversation: Any, tools: Any = None,
                            documents: Any = None, chat_template: str | None = None,
                            add_generation_prompt: bool = False,
                            continue_final_message: bool | str = False,
                            tokenize: bool = True, **options: Any) -> Any:
        """HuggingFace's ``apply_chat_template``: `conversation` (a list of ``{"role",
        "content"}`` messages, or a list of such lists) rendered with the model's chat template
        (or `chat_template`) in a sandbox, then tokenized without adding special tokens.

        Keyword options as HuggingFace's: ``padding``, ``truncation``, ``max_length``,
        ``return_tensors`` (``"pt"``: LongTensor [batch, seq], batch 1 for one conversation),
        ``return_dict`` (``{"input_ids", "attention_mask"}``; default False, transformers 4's:
        transformers 5 defaults to True), ``tokenizer_kwargs``; any other keyword is passed to
        the template. ``tokenize=False`` returns the text. No template: a
        :class:`~mi_core.tl.errors.TLTokenizerError` (a ValueError, as transformers')."""
        return _chat.apply_chat_template(
            self.inner, conversation, template=self.chat_template,
            special_tokens=self.special_tokens_map, pad_token_id=self.pad_token_id,
            padding_side=self.padding_side, tools=tools, documents=documents,
            chat_template=chat_template, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tokenize=tokenize, **options)

    def __repr__(self) -> str:
        return (f"TLTokenizer(name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size}, "
                f"padding_side={self.padding_side!r})")


def special_tokens_of(tokenizer: MITokenizer) -> dict[str, str]:
    """``bos_token`` / ``eos_token`` / ``pad_token`` of `tokenizer` as HuggingFace's
    ``special_tokens_map`` has them (only those it has; no TransformerLens fallbacks): what a
    chat template sees from ``MIModel.apply_chat_template``."""
    out = {}
    for key, i in (("bos_token", tokenizer.bos_token_id), ("eos_token", tokenizer.eos_token_id),
                   ("pad_token", _pad_id(tokenizer))):
        if i is not None:
            out[key] = tokenizer.decode([i])
    return out


def model_apply_chat_template(model: Any, conversation: Any, tools: Any = None,
                              documents: Any = None, chat_template: str | None = None,
                              add_generation_prompt: bool = False,
                              continue_final_message: bool | str = False,
                              tokenize: bool = True, **options: Any) -> Any:
    """``model.apply_chat_template(conversation, ...)`` on any :class:`mi_core.MIModel` (this
    ring's plugin registers it): :meth:`TLTokenizer.apply_chat_template` on the model's
    tokenizer, the template seeing its own special tokens (:func:`special_tokens_of`); padding
    on the right with its pad token, else EOS, else BOS."""
    tok = model.tokenizer
    pad = next((i for i in (_pad_id(tok), tok.eos_token_id, tok.bos_token_id) if i is not None),
               None)
    return _chat.apply_chat_template(
        tok, conversation, template=_chat.read_chat_template(tok),
        special_tokens=special_tokens_of(tok), pad_token_id=pad, tools=tools,
        documents=documents, chat_template=chat_template,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message, tokenize=tokenize, **options)


def _id_list(ids: Any) -> list[int]:
    if isinstance(ids, torch.Tensor):
        return [int(i) for i in ids.flatten().tolist()]
    if isinstance(ids, int):
        return [ids]
    if hasattr(ids, "tolist"):  # numpy
        ids = ids.tolist()
    return [int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]


def _tokenizer_config(tokenizer: MITokenizer) -> dict[str, Any]:
    """``tokenizer_config.json`` beside the tokenizer's ``tokenizer.json`` ({} if none)."""
    source = Path(str(getattr(tokenizer, "source", "")))
    cfg = source.parent / "tokenizer_config.json"
    if source.name != "tokenizer.json" or not cfg.is_file():
        return {}
    try:
        out = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def _pad_id(tokenizer: MITokenizer) -> int | None:
    """The tokenizer's own pad id: an attribute if it has one, else ``pad_token`` of the
    ``tokenizer_config.json`` beside a ``tokenizer.json`` (None when neither says)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if isinstance(pad, int):
        return pad
    source = Path(str(getattr(tokenizer, "source", "")))
    cfg = source.parent / "tokenizer_config.json"
    if source.name != "tokenizer.json" or not cfg.is_file():
        return None
    try:
        token = json.loads(cfg.read_text(encoding="utf-8")).get("pad_token")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    ids = tokenizer.encode(token, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None
