"""The TransformerLens layer's error kinds: mi-core errors that are also the builtin
exceptions TransformerLens raises for the same mistake, so TransformerLens code that catches
those keeps working (a module of its own: the cache and the hooking modules both raise them)."""

from __future__ import annotations

from mi_core import HookError, InputError, TokenizerError, WeightLoadError


class TLHookError(HookError, KeyError, AssertionError):
    """A hook name TransformerLens does not know, a cache entry that is not there, or a hook
    it refuses (``hook_result`` without ``use_attn_result``, ...): an
    :class:`mi_core.HookError` that is also the ``KeyError`` / ``AssertionError``
    TransformerLens raises."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TLHookTypeError(HookError, TypeError):
    """A cache key that is neither a hook name, a HookPoint nor a ``(name, layer[, type])``
    tuple (``cache[0]``): an :class:`mi_core.HookError` that is also the ``TypeError``
    TransformerLens' cache raises for it."""


class TLHookIndexError(HookError, IndexError, ValueError):
    """``hook.layer()`` of a hook point outside the blocks (or not yet named): an
    :class:`mi_core.HookError` that is also what TransformerLens raises there, the
    ``IndexError`` of a one-part name (``hook_embed``) and the ``ValueError`` of a dotted one
    (``ln_final.hook_normalized``) or of a HookPoint without a name."""


class TLTokenizerError(TokenizerError, ValueError):
    """A tokenizer that cannot do what is asked (``apply_chat_template`` without a chat
    template): an :class:`mi_core.TokenizerError` that is also the ``ValueError`` transformers
    raises."""


class TLValueError(InputError, ValueError):
    """An input TransformerLens refuses with a ``ValueError`` (a type ``to_str_tokens``
    cannot read, a tokens shape ``to_string`` cannot decode): an :class:`mi_core.InputError`
    that is also that ``ValueError``."""


class TLTypeError(InputError, TypeError):
    """A hook that is not callable, or a hook name that is neither a name nor a function: an
    :class:`mi_core.InputError` that is also the ``TypeError`` TransformerLens raises."""


class TLInputError(InputError, AssertionError):
    """A bad argument TransformerLens refuses with an assertion (a token that is not a single
    token, a token absent from a prompt, a batch-2 cache's batch axis removed, ...): an
    :class:`mi_core.InputError` that is also the ``AssertionError`` TransformerLens raises."""


class TLAttributeError(WeightLoadError, AttributeError):
    """A weight this model does not have (``W_pos`` of a rotary model, ``W_in`` of an
    attention-only one): an :class:`mi_core.WeightLoadError` that is also the
    ``AttributeError`` TransformerLens raises (so ``hasattr(model, "W_pos")`` is False)."""


__all__ = ["TLAttributeError", "TLHookError", "TLHookIndexError", "TLHookTypeError",
           "TLInputError", "TLTokenizerError", "TLTypeError", "TLValueError"]
