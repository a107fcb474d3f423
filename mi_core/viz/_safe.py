"""What every view checks before it writes a page: text that shows safely, inputs of the
right type and shape, NaN kept visible, and sizes a browser can draw.

Anything a page shows may be hostile (a tokenizer can produce any Unicode: lone surrogates,
control characters, bidi overrides, zero-width characters). Text is shown the way Python's
``repr`` shows it in the terminal: every character that does not print is escaped
(``\\n``, ``\\x1b``, ``\\u202e``, ``\\udc80``), so nothing is invisible, nothing reorders
the text around it, and the page always encodes as UTF-8.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

from mi_core.interp.describe import visible
from mi_core.plugin import ConfigError

__all__ = ["MAX_GRAPH_EDGES", "MAX_GRAPH_NODES", "MAX_LAYERS", "MAX_LINE", "MAX_TOKENS",
           "MAX_VALUES", "check_size", "check_tokens", "integer", "number", "token_text",
           "visible"]

#: positions (tokens) one page shows
MAX_TOKENS = 4096
#: layers (rows) one page shows; a model has at most a few hundred
MAX_LAYERS = 1024
#: numbers embedded in one page (float32: 32 MiB, about 43 MiB as base64)
MAX_VALUES = 1 << 23
#: attribution graph: nodes and edges drawn as SVG elements
MAX_GRAPH_NODES = 20_000
MAX_GRAPH_EDGES = 50_000
#: a title or a one-line description longer than this is cut (with an ellipsis)
MAX_LINE = 400

def token_text(token: Any) -> str:
    """A token as the terminal prints it: ``repr`` (quoted, every invisible character
    escaped), so ``' Paris'`` and ``'Paris'`` differ and a zero-width token shows."""
    return repr(str(token))


def check_tokens(tokens: Any, where: str, *, limit: int = MAX_TOKENS) -> list[str]:
    """`tokens` as a list of str; ConfigError naming the first one that is not a string,
    or the count when a page could not draw that many."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise ConfigError(f"{where}: tokens must be a list of strings, got "
                          f"{type(tokens).__name__}")
    out = list(tokens)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise ConfigError(f"{where}: token {i} is {type(t).__name__} {t!r}, not a string")
    check_size(len(out), limit, "tokens", where, "show a shorter prompt")
    return out


def check_size(n: int, limit: int, what: str, where: str, hint: str) -> None:
    """ConfigError when a page would hold `n` > `limit` `what` (it would hang the browser)."""
    if n > limit:
        raise ConfigError(f"{where}: {n:,} {what} are too many for one page (at most "
                          f"{limit:,}): {hint}")


def number(value: Any, where: str, field: str, *, optional: bool = True) -> float | None:
    """A real number (NaN and inf kept: a page shows them as NaN / inf); None when absent
    and `optional`; ConfigError naming `field` for anything else (a string, a list)."""
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: {field} is missing")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        try:  # a 0-d tensor or numpy scalar
            if getattr(value, "ndim", None) == 0 or getattr(value, "shape", None) == ():
                return float(value)
        except (TypeError, ValueError):
            pass
        raise ConfigError(f"{where}: {field} must be a number, got {type(value).__name__} "
                          f"{value!r:.60}")
    return float(value)


def integer(value: Any, where: str, field: str, low: int | None = None,
            high: int | None = None) -> int:
    """An int in [low, high]; ConfigError naming `field` for a missing, non-integer or
    out-of-range value (a float such as 2.5 is not an integer)."""
    if value is None:
        raise ConfigError(f"{where}: {field} is missing")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        ok = isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer()
        if not ok and getattr(value, "ndim", None) == 0:
            ok = float(value).is_integer()
        if not ok:
            raise ConfigError(f"{where}: {field} must be an integer, got {value!r:.60}")
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        rng = f"{'' if low is None else low}..{'' if high is None else high}"
        raise ConfigError(f"{where}: {field} is {v}, outside {rng}")
    return v
