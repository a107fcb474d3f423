"""The value-aware key policy: keys a family does not read, accepted at their neutral value.

A published ``config.json`` often carries keys the family's forward never reads: markers of
the tool that exported it, or settings at the one value that leaves the forward unchanged
(``rope_interleaved: false`` on a rotate-half family, ``use_mrope: false`` on Qwen2, a
``rotary_dim`` equal to the rotary width the family uses). Each family declares these as
data, ``neutral = {key: value}`` in its :class:`~mi_transformer.config.registry.Family`
entry; a value that depends on the rest of the config is a :class:`Derived` (computed from
the parsed :class:`TransformerConfig`). A key at its neutral value is accepted; at any other
value it is a ``ConfigError`` naming the key, the value and the neutral value, because the
forward would then differ from what the config asks for.

The policy, in order, for every non-null key of a config (:func:`policy_violations`):

1. read by the family's parser (implemented, or refused by the parser for values it cannot
   honour): the parser decided;
2. in the family's ``harmless`` set: accepted whatever its value;
3. in the family's ``neutral`` table: accepted at that value, else refused naming it;
4. generic (``mi_core.plugin.is_generic_harmless``: training and generation settings, token
   ids, export markers, ``_``-prefixed metadata, dropouts), except the ``_``-prefixed keys
   in :data:`PRIVATE_NUMERIC` that some transformers family reads for its numbers;
5. anything else: unknown, refused (:class:`UnknownKeysError` lists them).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

import attrs

from mi_core.plugin import ConfigError, is_generic_harmless

from mi_transformer.config.axes import TransformerConfig


@attrs.frozen
class Derived:
    """A neutral value computed from the parsed config; `describe` says what it is (shown
    in docs/BACKENDS.md and in the error)."""

    describe: str
    value: Callable[[TransformerConfig], Any]


#: The rotary width the family uses: the rotated leading dims of each head.
ROTARY_DIM = Derived("the rotary width", lambda c: c.rot_dim)
#: The MLP width and the KV head count the family reads under its own key names (Falcon's
#: ffn_hidden_size / num_kv_heads), repeated under LLaMA's by transformers' GGUF conversion.
MLP_WIDTH = Derived("the MLP width", lambda c: c.intermediate_size)
KV_HEADS = Derived("the number of KV heads", lambda c: c.num_kv_heads)
#: The norm eps the family reads, repeated under another family's key (StarCoder2-7B / 15B's
#: GPTBigCode-era ``layer_norm_epsilon`` beside ``norm_epsilon``).
NORM_EPS = Derived("the norm eps (norm_epsilon)", lambda c: c.norm_eps)
#: The vocabulary size, repeated by Hunyuan's configs as ``org_vocab_size``.
VOCAB = Derived("vocab_size", lambda c: c.vocab_size)
#: The keys every rotary family shares when its parser does not read them (a family's own
#: table or parser wins): ``rope_interleaved`` is nanotron's spelling of the rotary layout
#: (SmolLM2 says ``false``), neutral when it names the family's own layout; ``use_mrope:
#: false`` (Qwen2.5's text configs) turns off multimodal rotary sections no text family has;
#: ``rotary_dim`` equal to the rotary width restates it; ``attention_bias: false`` on a
#: family whose biases are fixed is what transformers ignores too (phi-1 publishes it), while
#: ``true`` would ask for biases the family's checkpoints do not have. Every rotate-half
#: family shares :data:`ROTARY`; the interleaved (GPT-J layout) ones use
#: :data:`ROTARY_INTERLEAVED`.
_SHARED: dict[str, Any] = {"use_mrope": False, "rotary_dim": ROTARY_DIM,
                           "attention_bias": False}
SHARED_KEYS = frozenset(_SHARED)
ROTARY: dict[str, Any] = {"rope_interleaved": False, **_SHARED}
ROTARY_INTERLEAVED: dict[str, Any] = {"rope_interleaved": True, **_SHARED}

#: ``_``-prefixed keys some transformers family reads for its numbers (OPT's final norm,
#: Gemma 3's window pattern): refused unless the family itself reads them.
PRIVATE_NUMERIC = frozenset({"_remove_final_layer_norm", "_sliding_window_pattern"})


def neutral_value(spec: Any, cfg: TransformerConfig) -> Any:
    return spec.value(cfg) if isinstance(spec, Derived) else spec


def describe(spec: Any) -> str:
    """How docs/BACKENDS.md shows a neutral value: JSON for a constant, words for Derived."""
    if isinstance(spec, Derived):
        return spec.describe
    if isinstance(spec, bool) or spec is None:
        return {True: "true", False: "false", None: "null"}[spec]
    return repr(spec) if not isinstance(spec, str) else f'"{spec}"'


def same_value(value: Any, neutral: Any) -> bool:
    """JSON equality without Python's coercions: ``true`` is not ``1``, ``0`` is not
    ``false``; an integer and a float are equal when their values are (``32`` and ``32.0``)."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    if isinstance(value, (int, float)) and isinstance(neutral, (int, float)):
        return math.isfinite(value) and float(value) == float(neutral)
    if isinstance(value, list) and isinstance(neutral, (list, tuple)):
        return len(value) == len(neutral) and all(map(same_value, value, neutral))
    return type(value) is type(neutral) and value == neutral


def policy_violations(cfg_dict: Mapping[str, Any], read: Iterable[str], harmless: Iterable[str],
                      neutral: Mapping[str, Any], parsed: TransformerConfig, src: str
                      ) -> list[str]:
    """The keys of `cfg_dict` that are unknown (step 5 above); a ConfigError for a key not
    at its neutral value (step 3). `read`: the keys the parser asked for."""
    seen, ok = set(read), set(harmless)
    unknown = []
    for key, value in cfg_dict.items():
        if value is None or key in seen or key in ok:
            continue
        if key in neutral:
            want = neutral_value(neutral[key], parsed)
            if not same_value(value, want):
                spec = neutral[key]
                how = f" ({spec.describe})" if isinstance(spec, Derived) else ""
                raise ConfigError(
                    f"{src}: {key} = {value!r} is not supported by the {parsed.model_type} "
                    f"family: it does not read {key!r}, and only its neutral value "
                    f"{want!r}{how} leaves the forward as the config describes it")
            continue
        if key in PRIVATE_NUMERIC or not is_generic_harmless(key, value):
            unknown.append(key)
    return sorted(unknown)
