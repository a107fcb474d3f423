"""One strict, typed reader for JSON config files (model configs, dictionary configs).

No coercion: an integer field takes a JSON integer (not a bool, not 2.0 or 2.7), a number
field a finite JSON number (not a bool), a flag ``true`` / ``false`` (not ``"false"``). A JSON
``null`` counts as absent. Every error is of the class the caller names (ConfigError for
model configs, DictionaryError for dictionaries) and names the file, the key and the value.
The reader remembers every key it was asked for, so a caller can refuse keys it never read.

Plugins subclass :class:`ConfigFields` for their own helpers; a subclass may also override
the ``*_error`` methods to word its messages differently.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any, Callable, Iterable, Mapping

from mi_core.errors import ConfigError, MIError

#: Default of a required field: absent (or null) raises.
REQUIRED: Any = object()

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {">": operator.gt, ">=": operator.ge,
                                                   "<=": operator.le}


class ConfigFields:
    """Typed, strict access to one JSON object `cfg` read from `where`.

    `fallback` is consulted for keys absent (or null) in `cfg`. `error` is the MIError
    subclass raised. ``read`` holds every key asked for (see :meth:`unread`).
    """

    #: How a missing required key is called in messages ("required field 'x' is missing").
    required_word = "field"

    def __init__(self, cfg: Mapping[str, Any], where: Any, *, error: type[MIError] = ConfigError,
                 fallback: Mapping[str, Any] | None = None) -> None:
        self.cfg, self.where, self.error = cfg, where, error
        self.fallback: Mapping[str, Any] = fallback or {}
        self.read: set[str] = set()

    # -- messages (override to word them differently) ------------------------------------

    def fail(self, key: str, why: str) -> MIError:
        return self.error(f"{self.where}: key {key!r} = {self.get(key)!r}: {why}")

    def missing_error(self, key: str) -> MIError:
        return self.error(f"{self.where}: required {self.required_word} {key!r} is missing")

    def type_error(self, key: str, value: Any, expected: str) -> MIError:
        """`value` is not of the JSON type `expected` ("an integer", "a number", ...)."""
        return self.fail(key, f"expected {expected}, got {type(value).__name__}")

    def min_error(self, key: str, value: int, minimum: int) -> MIError:
        return self.fail(key, f"must be >= {minimum}")

    def number_error(self, key: str, value: float, broken: tuple[str, float] | None,
                     bounds: list[tuple[str, float]]) -> MIError:
        """`value` is not finite (`broken` None) or breaks the bound `broken` of `bounds`."""
        return self.fail(key, "must be a finite number" + "".join(f" {op} {b}" for op, b in bounds))

    def choice_error(self, key: str, value: str, choices: Iterable[str]) -> MIError:
        return self.fail(key, f"expected one of {', '.join(choices)}")

    # -- access --------------------------------------------------------------------------

    def get(self, key: str) -> Any:
        """The raw value of `key` (or its fallback); None when absent. Marks `key` read."""
        self.read.add(key)
        v = self.cfg.get(key)
        return self.fallback.get(key) if v is None else v

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def _value(self, key: str, default: Any) -> Any:
        v = self.get(key)
        if v is None and default is REQUIRED:
            raise self.missing_error(key)
        return v

    def integer(self, key: str, default: Any = REQUIRED, minimum: int | None = 1) -> Any:
        """A JSON integer >= `minimum` (no bound if None); `default` when absent or null."""
        v = self._value(key, default)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.type_error(key, v, "an integer")
        if minimum is not None and v < minimum:
            raise self.min_error(key, v, minimum)
        return v

    def number(self, key: str, default: Any = REQUIRED, *, gt: float | None = None,
               ge: float | None = None, le: float | None = None) -> Any:
        """A finite JSON number (int or float) within the given bounds, as a float."""
        v = self._value(key, default)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.type_error(key, v, "a number")
        bounds = [(op, b) for op, b in ((">", gt), (">=", ge), ("<=", le)) if b is not None]
        if not math.isfinite(v):
            raise self.number_error(key, v, None, bounds)
        for op, b in bounds:
            if not _COMPARE[op](v, b):
                raise self.number_error(key, v, (op, b), bounds)
        return float(v)

    def flag(self, key: str, default: Any = REQUIRED) -> Any:
        """JSON ``true`` / ``false``; `default` when absent or null."""
        v = self._value(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.type_error(key, v, "true or false")
        return v

    def text(self, key: str, default: Any = REQUIRED, choices: Iterable[str] | None = None
             ) -> Any:
        """A JSON string (one of `choices` if given); `default` when absent or null."""
        v = self._value(key, default)
        if v is None:
            return default
        if not isinstance(v, str):
            raise self.type_error(key, v, "a string")
        if choices is not None and v not in choices:
            raise self.choice_error(key, v, choices)
        return v

    def mapping(self, key: str, default: Any = None) -> Any:
        """A JSON object; `default` when absent or null."""
        return self._container(key, default, Mapping, "a JSON object")

    def sequence(self, key: str, default: Any = None) -> Any:
        """A JSON list; `default` when absent or null."""
        return self._container(key, default, list, "a JSON list")

    def _container(self, key: str, default: Any, kind: type, expected: str) -> Any:
        v = self.get(key)
        if v is None:
            return default
        if not isinstance(v, kind):
            raise self.type_error(key, v, expected)
        return v

    def unread(self, harmless: Iterable[str] = ()) -> list[str]:
        """Present (non-null) keys neither read nor in `harmless` nor generic-harmless."""
        ok = set(harmless) | self.read
        return sorted(k for k, v in self.cfg.items()
                      if v is not None and k not in ok and not is_generic_harmless(k, v))


#: Keys every transformers ``config.json`` may carry that do not change a forward pass in
#: eval (training, generation defaults, token ids, dtype, bookkeeping). Dropouts match a
#: pattern.
GENERIC_HARMLESS: frozenset[str] = frozenset({
    "_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype",
    "model_type", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "use_cache", "initializer_range", "init_std", "initializer_factor",
    "_num_labels",
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
    "tf_legacy_loss", "id2label", "label2id", "num_labels", "problem_type", "finetuning_task",
    "tokenizer_class", "prefix", "task_specific_params", "is_decoder", "max_length",
    "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "chunk_size_feed_forward",
    "cross_attention_hidden_size", "gradient_checkpointing", "_attn_implementation",
    "attn_implementation", "_attn_implementation_autoset", "pretraining_tp",
    "tie_encoder_decoder", "keys_to_ignore_at_inference",
    # export markers of converters and fine-tuning tools (nanotron, transformers.js, unsloth)
    "is_llama_config", "transformers.js_config", "unsloth_version", "unsloth_fixed",
})

#: Generic keys that are harmless only at their default (e.g. encoder-decoder or cross
#: attention would need weights and a forward we do not have).
GENERIC_AT_DEFAULT: dict[str, Any] = {"is_encoder_decoder": False, "add_cross_attention": False,
                                      "pruned_heads": {}}

_DROPOUT = re.compile(r"(^|_)(dropout|pdrop)$|dropout|_pdrop$|^layerdrop$")


#: token ids of any kind (``unk_token_id``, ``image_token_index``): no forward reads them
_TOKEN_ID = re.compile(r"_token_(id|ids|index)$")


def is_generic_harmless(key: str, value: Any) -> bool:
    """Whether `key` = `value` is a generic transformers config entry that cannot change
    the numbers: the keys above, dropouts, token ids and ``_``-prefixed metadata (e.g. the
    ``_model_name_or_path`` transformers writes from a GGUF file)."""
    if key in GENERIC_HARMLESS or _DROPOUT.search(key) or _TOKEN_ID.search(key) \
            or key.startswith("_"):
        return True
    return key in GENERIC_AT_DEFAULT and value == GENERIC_AT_DEFAULT[key]
