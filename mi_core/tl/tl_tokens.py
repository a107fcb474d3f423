"""Tokens and generation of :class:`~mi_core.tl.HookedTransformer`, as TransformerLens has them.

``to_tokens`` prepends BOS by default (``cfg.default_prepend_bos``) and pads lists of texts
(``padding_side``, default the tokenizer's, "right"); ``to_string`` / ``to_str_tokens`` /
``to_single_token`` / ``get_token_position`` / ``tokens_to_residual_directions`` take what
TransformerLens' take; ``generate(text)`` returns text (tokens for tokens), sampling by
default (``do_sample=True``, TransformerLens' sampler, so ``torch.manual_seed`` gives the same
draws), with the hooks on the model applied at every step and the kernel's KV cache.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from mi_core import InputError, TokenizerError
from mi_core.plugin import KVCachedGeneration, has_capability
from mi_core.tl.errors import TLValueError
from mi_core.tl.utils import (
    USE_DEFAULT_VALUE, TLInputError, get_attention_mask, sample_logits,
)


class TokensMixin:
    """The token methods of HookedTransformer (`self` is the model)."""

    cfg: Any
    tokenizer: Any
    mi_model: Any

    def _tok(self, what: str) -> Any:
        if self.tokenizer is None:
            raise TokenizerError(f"{what}: this model has no tokenizer")
        return self.tokenizer

    def _bos(self, prepend_bos: Optional[bool]) -> bool:
        return self.cfg.default_prepend_bos if prepend_bos is None else bool(prepend_bos)

    def set_tokenizer(self, tokenizer: Any, default_padding_side: Optional[str] = None
                      ) -> None:
        """TransformerLens' ``set_tokenizer``: a transformers (fast) tokenizer object becomes
        the model's, for the TransformerLens class and its ``mi_model``; padding on
        `default_padding_side`, else the tokenizer's, else "right"."""
        from mi_core.tl.hf_objects import mi_tokenizer
        from mi_core.tl.tokenizer import TLTokenizer

        side = default_padding_side or getattr(tokenizer, "padding_side", None) or "right"
        if side not in ("left", "right"):
            raise InputError(f"default_padding_side must be 'left' or 'right', got {side!r}")
        self.mi_model.backend.tokenizer = mi_tokenizer(tokenizer)
        self.tokenizer = TLTokenizer(self.mi_model.tokenizer, side,
                                     name_or_path=getattr(tokenizer, "name_or_path", "") or "")
        self.cfg.tokenizer_prepends_bos = True  # TransformerLens' tokenizer_with_bos

    def to_tokens(self, input: str | Sequence[str],
                  prepend_bos: Optional[bool] = USE_DEFAULT_VALUE,
                  padding_side: Optional[str] = USE_DEFAULT_VALUE, move_to_device: bool = True,
                  truncate: bool = True) -> torch.Tensor:
        """Text (or texts, padded on `padding_side`) -> tokens [batch, pos], BOS first unless
        `prepend_bos` (default ``cfg.default_prepend_bos``) is False; truncated to n_ctx."""
        tok = self._tok("to_tokens")
        texts = [input] if isinstance(input, str) else list(input)
        if not texts:
            raise InputError("to_tokens needs a string or a non-empty list of strings")
        if not all(isinstance(t, str) for t in texts):  # TransformerLens' tokenizer: ValueError
            raise TLValueError(f"to_tokens needs a string or a list of strings, got "
                               f"{type(input).__name__}")
        rows = [tok.ids(t, self._bos(prepend_bos)) for t in texts]
        if truncate:
            rows = [r[:self.cfg.n_ctx] for r in rows]
        ids, _ = tok.pad(rows, padding_side)
        return ids.to(self.mi_model.device) if move_to_device else ids

    def input_to_tokens(self, input: Any, prepend_bos: Optional[bool],
                        padding_side: Optional[str], attention_mask: Optional[torch.Tensor]
                        ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(tokens [batch, pos], attention mask or None) of a forward's input: the mask is
        computed as TransformerLens does, when the padding side is left."""
        if isinstance(input, (str, list)):
            tokens = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side)
        elif isinstance(input, torch.Tensor):
            tokens = input
        else:
            raise InputError(f"input must be a text, a list of texts or tokens [batch, pos], "
                             f"got {type(input).__name__}")
        if tokens.dim() == 1:
            tokens = tokens[None]
        tokens = tokens.to(self.mi_model.device)
        side = padding_side or (self.tokenizer.padding_side if self.tokenizer else "right")
        if attention_mask is None and self.tokenizer is not None and side == "left":
            attention_mask = get_attention_mask(self.tokenizer, tokens, self._bos(prepend_bos),
                                                side)
        if attention_mask is not None:
            if attention_mask.shape != tokens.shape:
                raise InputError(f"attention mask shape {tuple(attention_mask.shape)} does not "
                                 f"match tokens shape {tuple(tokens.shape)}")
            attention_mask = attention_mask.to(self.mi_model.device)
        return tokens, attention_mask

    def to_string(self, tokens: Any) -> str | list[str]:
        """[pos] tokens (or an int) -> text; [batch, pos] -> one text per row."""
        tok = self._tok("to_string")
        if not isinstance(tokens, torch.Tensor):
            tokens = torch.tensor(tokens)
        if tokens.dim() == 2:
            return tok.batch_decode(tokens)
        if tokens.dim() <= 1:
            return tok.decode(tokens)
        raise TLValueError(f"Invalid shape passed in: {tuple(tokens.shape)}")

    def to_str_tokens(self, input: Any, prepend_bos: Optional[bool] = USE_DEFAULT_VALUE,
                      padding_side: Optional[str] = USE_DEFAULT_VALUE) -> Any:
        """Each token as a string: of a text (tokenized as ``to_tokens``), of tokens [pos] or
        [1, pos]; a list gives one list per element."""
        tok = self._tok("to_str_tokens")
        if isinstance(input, list):
            return [self.to_str_tokens(x, prepend_bos, padding_side) for x in input]
        if isinstance(input, str):
            tokens = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side)[0]
        elif isinstance(input, torch.Tensor) or hasattr(input, "squeeze"):
            tokens = torch.as_tensor(input).squeeze()
            if tokens.dim() == 0:
                tokens = tokens.unsqueeze(0)
            if tokens.dim() != 1:
                raise TLInputError(f"Invalid tokens input to to_str_tokens, has shape: "
                                   f"{tuple(tokens.shape)}")
        else:
            raise TLValueError(f"Invalid input type to to_str_tokens: {type(input).__name__}")
        return tok.batch_decode([[int(t)] for t in tokens.tolist()])

    def to_single_token(self, string: str) -> int:
        """The id of the one token `string` is (no BOS); an error if it is several."""
        token = self.to_tokens(string, prepend_bos=False).squeeze()
        if token.shape:
            raise TLInputError(f"Input string: {string} is not a single token!")
        return int(token.item())

    def to_single_str_token(self, int_token: int) -> str:
        if not isinstance(int_token, int):
            raise TLInputError(f"to_single_str_token needs an int, got {type(int_token).__name__}")
        return self.to_str_tokens(torch.tensor([int_token]))[0]

    def get_token_position(self, single_token: str | int, input: Any, mode: str = "first",
                           prepend_bos: Optional[bool] = USE_DEFAULT_VALUE,
                           padding_side: Optional[str] = USE_DEFAULT_VALUE) -> int:
        """Position of `single_token` in a text or tokens ("first" or "last" occurrence)."""
        tokens = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side) \
            if isinstance(input, str) else input
        if tokens.dim() == 2:
            if tokens.shape[0] != 1:
                raise TLInputError(f"If tokens are rank two, they must have shape [1, seq_len], "
                                   f"not {tuple(tokens.shape)}")
            tokens = tokens[0]
        if isinstance(single_token, str):
            single_token = self.to_single_token(single_token)
        elif isinstance(single_token, torch.Tensor):
            single_token = int(single_token.item())
        indices = torch.arange(len(tokens), device=tokens.device)[tokens == single_token]
        if not len(indices):
            raise TLInputError("The token does not occur in the prompt")
        if mode not in ("first", "last"):
            raise TLValueError(f"mode must be 'first' or 'last', not {mode}")
        return int(indices[0 if mode == "first" else -1].item())

    def tokens_to_residual_directions(self, tokens: Any) -> torch.Tensor:
        """W_U columns of `tokens` (a str, an int or a tensor of ids): [d_model] for one
        token, else [*tokens.shape, d_model]."""
        if isinstance(tokens, str):  # TransformerLens' AssertionError for several tokens
            tokens = self.to_single_token(tokens)
        return self.mi_model.tokens_to_residual_directions(tokens)

    # -- generation ----------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, input: Any = "", max_new_tokens: int = 10, stop_at_eos: bool = True,
                 eos_token_id: Optional[int | Sequence[int]] = None, do_sample: bool = True,
                 top_k: Optional[int] = None, top_p: Optional[float] = None,
                 temperature: float = 1.0, *, freq_penalty: float = 0.0,
                 use_past_kv_cache: bool = True, prepend_bos: Optional[bool] = USE_DEFAULT_VALUE,
                 padding_side: Optional[str] = USE_DEFAULT_VALUE, return_type: str = "input",
                 verbose: bool = True) -> Any:
        """Sample up to `max_new_tokens` tokens after `input` (a text, a list of texts, left
        padded, or tokens [batch, pos]); returns text for text ("str"), tokens for tokens
        ("tokens"), or the sequence's embeddings [batch, pos, d_model] ("embeds"). Hooks on
        the model apply at every step."""
        if return_type not in ("input", "str", "tokens", "embeds"):
            raise TLInputError(f"return_type must be one of ['input', 'str', 'tokens', "
                               f"'embeds'], got {return_type!r}")
        is_text = isinstance(input, (str, list))
        if return_type == "input":
            return_type = "str" if is_text else "tokens"
        tokens, mask = self._generation_input(input, prepend_bos, padding_side)
        stop_tokens, pad_token = self._stop_tokens(stop_at_eos, eos_token_id)
        output = self._sample(tokens, mask, max_new_tokens, stop_tokens, pad_token,
                              dict(do_sample=do_sample, top_k=top_k, top_p=top_p,
                                   temperature=temperature, freq_penalty=freq_penalty),
                              use_past_kv_cache)
        if return_type == "tokens":
            return output
        if return_type == "embeds":  # TransformerLens: the embeddings of the whole sequence
            return self.embed(output)  # type: ignore[attr-defined]
        texts = [self._tok("generate").decode(row, skip_special_tokens=True) for row in output]
        return texts[0] if len(texts) == 1 else texts

    def _generation_input(self, input: Any, prepend_bos: Optional[bool],
                          padding_side: Optional[str]
                          ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        batched = isinstance(input, list) and len(input) > 1
        if isinstance(input, (str, list)):
            tokens = self.to_tokens(input, prepend_bos=prepend_bos,
                                    padding_side="left" if batched else padding_side)
        elif isinstance(input, torch.Tensor) and input.dim() == 2:
            tokens = input.to(self.mi_model.device)
        else:
            raise TLInputError("generate needs a text, a list of texts or tokens [batch, pos]")
        mask = None
        if self.tokenizer is not None:
            side = "left" if batched else (padding_side or self.tokenizer.padding_side)
            mask = get_attention_mask(self.tokenizer, tokens, self._bos(prepend_bos), side)
        return tokens, mask

    def _stop_tokens(self, stop_at_eos: bool, eos_token_id: Any) -> tuple[list[int], int]:
        if not stop_at_eos:
            return [], 0
        if eos_token_id is None:
            eos_token_id = self._tok("generate(stop_at_eos=True)").eos_token_id
        if isinstance(eos_token_id, int):
            return [eos_token_id], eos_token_id
        pad = self.tokenizer.eos_token_id if self.tokenizer is not None else eos_token_id[0]
        return list(eos_token_id), pad

    def _sample(self, tokens: torch.Tensor, mask: Optional[torch.Tensor], max_new_tokens: int,
                stop_tokens: list[int], pad_token: int, sampling: dict[str, Any],
                use_cache: bool) -> torch.Tensor:
        """TransformerLens' generation loop over the kernel's forward (KV-cached when the
        backend can): finished rows keep receiving the EOS token."""
        batch = tokens.shape[0]
        cached = use_cache and has_capability(self.mi_model.backend, KVCachedGeneration)
        past = self.mi_model.backend.new_past(batch) if cached else None
        finished = torch.zeros(batch, dtype=torch.bool, device=tokens.device)
        sampled: list[torch.Tensor] = []
        stops = torch.tensor(stop_tokens, device=tokens.device)
        do_sample = sampling.pop("do_sample")
        for step in range(max_new_tokens):
            full = torch.cat([tokens] + sampled, dim=1)
            step_mask = None if mask is None else torch.cat(
                [mask, torch.ones(batch, len(sampled), dtype=mask.dtype, device=mask.device)], 1)
            ids = full[:, -1:] if cached and step > 0 else full
            # TransformerLens' generate embeds outside its forward: hook_embed does not run
            logits = self._run(ids, step_mask, past=past,  # type: ignore[attr-defined]
                               embed=frozenset({"hook_pos_embed"}))
            final = logits[:, -1, :]
            if do_sample:
                new = sample_logits(final, tokens=full, **sampling)
            else:
                new = final.argmax(-1)
            new = new.to(tokens.device)
            if stop_tokens:
                new[finished] = pad_token
                finished |= torch.isin(new, stops)
            sampled.append(new.unsqueeze(1))
            if stop_tokens and bool(finished.all()):
                break
        return torch.cat([tokens] + sampled, dim=1)

    def get_pos_offset(self, past_kv_cache: Any, batch_size: int) -> int:
        """TransformerLens' position offset of a forward after `past_kv_cache` (a
        :class:`~mi_core.tl.past_key_value_caching.HookedTransformerKeyValueCache`): the
        positions it holds, 0 without one."""
        if past_kv_cache is None:
            return 0
        held = past_kv_cache.previous_attention_mask.shape
        if held[0] != batch_size:
            raise TLInputError(f"past_kv_cache holds batch {held[0]}, not {batch_size}")
        return int(held[1])

    @property
    def n_params_total(self) -> int:
        """Every parameter's element count (TransformerLens' ``n_params_total``)."""
        return sum(p.numel() for p in self.parameters())  # type: ignore[attr-defined]
