"""One readable line saying what an analysis did, for the titles, subtitles and axes of the
pictures and pages and for the terminal: the layers and heads, the edges as query → key
with their tokens, the hook point, the strength, the metric and its sign convention.

No repr of a spec or a tensor ever reaches a title: a steering direction is described by
its size and norm, never printed. Tokens are quoted as the terminal prints them
(``repr``: ``' Paris'``, ``'\\n'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

#: positions listed one by one in a description; longer lists become a range
_LIST = 4
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def visible(text: Any, limit: int | None = None) -> str:
    """`text` with every character that does not print escaped as Python writes it
    (controls, format characters such as bidi overrides and zero-width spaces, lone
    surrogates, separators other than the space); cut to `limit` characters (+ "…")."""
    s = "".join(c if c.isprintable() else _escape(c) for c in str(text))
    if limit is not None and len(s) > limit:
        s = s[: limit - 1] + "\u2026"
    return s


def tok(token: Any) -> str:
    """A token quoted as the terminal prints it: ``' Paris'``."""
    return repr(str(token))


def span(values: Sequence[int] | None, everything: str = "all") -> str:
    """``[8, 9, 10]`` -> "8-10", ``[1, 3]`` -> "1,3", None -> `everything`."""
    if values is None:
        return everything
    v = [int(x) for x in values]
    if len(v) > 2 and v == list(range(v[0], v[-1] + 1)):
        return f"{v[0]}-{v[-1]}"
    return ",".join(map(str, v))


def model_label(model_or_source: Any) -> str:
    """A short model name: the checkpoint's file or folder name (a hub id as it is)."""
    src = getattr(model_or_source, "source", model_or_source)
    text = str(src or "")
    if not text:
        return ""
    p = Path(text)
    if p.exists() or text.startswith(("/", ".", "~")) or "\\" in text:
        return p.name or text
    return text  # a hub id, "org/name"


def str_tokens(model: Any, ids: Any) -> list[str] | None:
    """The prompt's tokens as text (None when the model has no tokenizer)."""
    try:
        return list(model.to_str_tokens(ids[0])) if model.has_tokenizer else None
    except Exception:  # a tokenizer that cannot decode: titles fall back to positions
        return None


def position(pos: int, tokens: Sequence[str] | None) -> str:
    """"4 ' is'" (a negative position resolved against `tokens`); "-1" without tokens."""
    if tokens:
        p = pos + len(tokens) if pos < 0 else pos
        if 0 <= p < len(tokens):
            return f"{p} {tok(tokens[p])}"
    return str(pos)


def positions(ps: Sequence[int] | None, tokens: Sequence[str] | None,
              every: str = "every position") -> str:
    """A few positions with their tokens; a long list as "0-9 ('The' … ' is')"."""
    if ps is None:
        return every
    ps = [int(p) for p in ps]
    if len(ps) <= _LIST:
        return ", ".join(position(p, tokens) for p in ps)
    if tokens:
        n = len(tokens)
        res = sorted({p + n if p < 0 else p for p in ps})
        return f"{span(res)} ({position(res[0], tokens).split(' ', 1)[-1]} \u2026 " \
               f"{position(res[-1], tokens).split(' ', 1)[-1]})"
    return span(ps)


def _layers_heads(layers: Sequence[int] | None, heads: Sequence[int] | None) -> str:
    ls = "all layers" if layers is None else (
        f"layer {span(layers)}" if len(layers) == 1 else f"layers {span(layers)}")
    hs = "all heads" if heads is None else (
        f"head {span(heads)}" if len(heads) == 1 else f"heads {span(heads)}")
    return f"{ls}, {hs}"


def describe_knockout(spec: Any, tokens: Sequence[str] | None = None) -> str:
    """"layers 8-15, all heads; removed edges query → key: 4 ' is' → 3 ' France'"."""
    if spec is None:
        return "attention knockout (spec not recorded)"
    parts = [f"{position(q, tokens)} \u2192 {position(k, tokens)}" for q, k in spec.edges]
    if spec.from_positions is not None or spec.to_positions is not None:
        q = positions(spec.from_positions, tokens, "every query")
        k = positions(spec.to_positions, tokens, "every key")
        parts.append(f"{q} \u2192 {k}")
    return (f"{_layers_heads(spec.layers, spec.heads)}; removed edges query \u2192 key: "
            + "; ".join(parts))


def _direction(direction: Any) -> str:
    try:
        n = int(direction.numel())
        norm = float(direction.float().norm())
        return f"direction ({n}-d, \u2016v\u2016 = {norm:.3g})"
    except (AttributeError, TypeError, ValueError):
        return "direction"


def describe_steering(spec: Any, tokens: Sequence[str] | None = None,
                      sweep: bool = False) -> str:
    """Attention: "attention of query 4 ' is' to key 3 ' France' × 4 (rows renormalised),
    layers 10-19, all heads"; residual: "add 4 × direction (576-d, ‖v‖ = 3.2) to
    blocks.6.hook_resid_pre at position 3 ' France'". `sweep`: the strength is the variable
    ("× s"), for a dose-response curve."""
    if spec is None:
        return "steering (spec not recorded)"
    if spec.kind == "attention":
        q = positions(spec.from_positions, tokens, "every query")
        k = positions(spec.to_positions, tokens, "every key")
        if spec.value is not None:
            how = "set to s" if sweep else f"set to {spec.value:g}"
        else:
            how = "\u00d7 s" if sweep else f"\u00d7 {spec.scale:g}"
        return (f"attention of query {q} to key {k} {how} (rows renormalised), "
                f"{_layers_heads(spec.layers, spec.heads)}")
    layers = list(spec.layers)
    point = (f"blocks.{layers[0]}.{spec.point}" if len(layers) == 1
             else f"{spec.point} of layers {span(layers)}")
    amount = "s" if sweep else f"{spec.strength:g}"
    where = positions(spec.from_positions, tokens, "every position")
    return (f"add {amount} \u00d7 {_direction(spec.direction)} to {point} at "
            f"{'position ' if spec.from_positions is not None else ''}{where}")


def describe_patching(result: Any) -> str:
    """"exact patching of resid_pre, layers 0-29 × positions; corrupted 'The capital of
    Italy is', clean 'The capital of France is'; metric logit(' Paris') − logit(' Rome')
    (logits), normalised: 0 = corrupted, 1 = clean"."""
    cols = "heads" if result.kind in ("z", "q", "k", "v", "result", "pattern") else "positions"
    parts = [f"{result.method} patching of {result.kind}, layers {span(result.layers)} "
             f"\u00d7 {cols}"]
    if getattr(result, "corrupted_prompt", None) is not None:
        parts.append(f"clean activations patched into the corrupted run "
                     f"{result.corrupted_prompt!r}")
    how = ("normalised: 0 = corrupted, 1 = clean" if getattr(result, "normalised", True)
           else "raw values (not normalised)")
    parts.append(f"metric {metric_label(result)}, {how}")
    return "; ".join(parts)


def metric_label(result: Any) -> str:
    """"logit(' Paris') − logit(' Rome') (logits)", or "(unnamed)" when it was not named."""
    name = getattr(result, "metric_name", None) or "(unnamed)"
    units = getattr(result, "metric_units", None)
    return f"{name} ({units})" if units else name
