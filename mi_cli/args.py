"""Argument types and shared options of the ``mi`` subcommands (no torch: they run while
the command line is parsed).

Every value is checked while parsing, so a bad one is a usage error (exit code 2, one
``mi: error: argument --NAME: ...`` line on stderr) before any model is loaded.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Sequence

#: ``--plot`` extensions: static pictures (matplotlib) and the interactive HTML page.
PICTURE_SUFFIXES = (".png", ".svg", ".pdf")
PLOT_SUFFIXES = PICTURE_SUFFIXES + (".html",)
DTYPES = ("float32", "float16", "bfloat16")
#: What a checkpoint file may end in; such a --model value must exist.
_FILE_SUFFIXES = (".gguf", ".safetensors", ".pth", ".pt", ".bin", ".json")
#: "-1,3", "-2", "0,-1": argparse would take these for options without this matcher.
NEGATIVE_NUMBER = re.compile(r"^-\d[\d,.\-]*$")
_INT = re.compile(r"^\s*(-?\d+)\s*$")
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def _bad(msg: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(msg)


def text(value: str) -> str:
    """A non-empty prompt."""
    if not value.strip():
        raise _bad("must not be empty")
    return value


def _int_at_least(value: str, low: int, what: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise _bad(f"{value!r} is not an integer") from None
    if n < low:
        raise _bad(f"must be {what}, got {n}")
    return n


def positive_int(value: str) -> int:
    return _int_at_least(value, 1, "at least 1")


def nonneg_int(value: str) -> int:
    return _int_at_least(value, 0, "0 or more")


def int_list(value: str) -> list[int]:
    """"3", "1,4,7", "0-5" (inclusive), "-1,-2" (negative indices) -> list of ints."""
    out: list[int] = []
    for part in value.split(","):
        if not part.strip():
            continue
        if m := _INT.match(part):
            out.append(int(m.group(1)))
        elif m := _RANGE.match(part):
            a, b = int(m.group(1)), int(m.group(2))
            if b < a:
                raise _bad(f"range {part.strip()!r} is empty (write LOW-HIGH)")
            out += list(range(a, b + 1))
        else:
            raise _bad(f"{part.strip()!r} is not an integer or a range LOW-HIGH "
                       f"(e.g. 3, 1,4,7 or 0-5)")
    if not out:
        raise _bad("no numbers given")
    return out


def float_list(value: str) -> list[float]:
    out = []
    for part in value.split(","):
        if not part.strip():
            continue
        try:
            x = float(part)
        except ValueError:
            raise _bad(f"{part.strip()!r} is not a number (comma-separated, "
                       "e.g. 0,0.5,1)") from None
        if x != x or x in (float("inf"), float("-inf")):
            raise _bad(f"{part.strip()!r} is not a finite number")
        out.append(x)
    if not out:
        raise _bad("no numbers given")
    return out


def edge(value: str) -> tuple[int, int]:
    """QUERY,KEY, e.g. "-1,3"."""
    m = re.match(r"^\s*(-?\d+)\s*,\s*(-?\d+)\s*$", value)
    if not m:
        raise _bad(f"{value!r} is not QUERY,KEY (two positions, e.g. -1,3)")
    return int(m.group(1)), int(m.group(2))


def device(value: str) -> str:
    """A torch device that exists on this machine ("cpu" is checked without importing torch)."""
    if value == "cpu":
        return value
    import torch

    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError):
        raise _bad(f"{value!r} is not a device (cpu, cuda, cuda:1, mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise _bad(f"{value!r}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise _bad(f"{value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise _bad(f"{value!r}: MPS is not available on this machine")
    elif dev.type != "cpu":
        raise _bad(f"{value!r}: unsupported device type {dev.type!r} (cpu, cuda, mps)")
    return value


def dtype(value: str) -> str:
    """One of DTYPES, by name (the command turns it into a torch dtype when it loads)."""
    if value not in DTYPES:
        raise _bad(f"{value!r} is not one of {', '.join(DTYPES)}")
    return value


def model_source(value: str) -> str:
    """A directory, a checkpoint file or a hub id; a path-like value must exist."""
    if not value.strip():
        raise _bad("must not be empty")
    p = Path(value).expanduser()
    if p.exists():
        return str(p)
    looks_like_path = (value.startswith((".", "/", "~")) or value.lower().endswith(_FILE_SUFFIXES)
                       or value.count("/") > 1 or "\\" in value)
    if looks_like_path:
        raise _bad(f"{value}: no such file or directory")
    return value


def plot_path(value: str) -> str:
    suffix = Path(value).suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise _bad(f"{value!r}: unsupported extension {suffix or '(none)'!r}; use "
                   f"{', '.join(PLOT_SUFFIXES)} (.html: an interactive page)")
    return value


def picture_path(value: str) -> str:
    """--plot for a command without an interactive view: .png, .svg or .pdf only."""
    suffix = Path(value).suffix.lower()
    if suffix not in PICTURE_SUFFIXES:
        raise _bad(f"{value!r}: unsupported extension {suffix or '(none)'!r}; this command "
                   f"writes pictures: {', '.join(PICTURE_SUFFIXES)}")
    return value


class Parser(argparse.ArgumentParser):
    """argparse with ``mi: error: ...`` messages and option values that may start with '-'
    when they are numbers or number lists (``--edge -1,3``, ``--to -2``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str) -> None:  # type: ignore[override]
        import sys

        self.print_usage(sys.stderr)
        argv = getattr(self, "mi_argv", None)
        found = _command_parser(self, argv)
        prog = found[1].prog if found else self.prog
        self.exit(2, f"mi: error: {message}{suggestion(self, message, argv)} (see {prog} "
                     "--help)\n")


_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of its subcommands' parsers."""
    out: set[str] = set()
    for action in parser._actions:
        out.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _options(sub)
    return out


def _command_parser(parser: argparse.ArgumentParser,
                    argv: Sequence[str] | None) -> tuple[str, argparse.ArgumentParser] | None:
    """The subcommand named in `argv` and its parser (None when there is none)."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    word = next((a for a in argv or () if not a.startswith("-")), None)
    if sub is None or word not in sub.choices:
        return None
    return word, sub.choices[word]


def suggestion(parser: argparse.ArgumentParser, message: str,
               argv: Sequence[str] | None = None) -> str:
    """"; did you mean 'knockout'?" for a mistyped command, choice or option (difflib). An
    unknown option is matched against the options of the command named in `argv` only, so
    an option of another command is said to be one (``--layer`` is not an option of
    ``mi logit-lens``)."""
    import difflib

    if m := _CHOICE.search(message):
        choices = re.findall(r"'([^']*)'", m.group(2))
        close = difflib.get_close_matches(m.group(1), choices, n=2, cutoff=0.6)
        return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    if message.startswith("unrecognized arguments:"):
        found = _command_parser(parser, argv)
        known = sorted(_options(found[1] if found else parser))
        hints = []
        for word in message.split(":", 1)[1].split():
            if not word.startswith("-"):
                continue
            close = difflib.get_close_matches(word.split("=")[0], known, n=1, cutoff=0.6)
            if close and close[0] != word.split("=")[0]:
                hints.append(f"did you mean {close[0]} for {word}?")
            elif found:
                hints.append(f"mi {found[0]} has no option {word.split('=')[0]}")
        return "; " + "; ".join(hints) if hints else ""
    return ""


def output_options(p: argparse.ArgumentParser, top_level: bool = False) -> None:
    """``-q/--quiet`` and ``--verbose`` (on the main parser and on every subcommand)."""
    default = False if top_level else argparse.SUPPRESS
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true", default=default,
                   help="print nothing but errors (results still go to --json / --plot)")
    g.add_argument("--verbose", action="store_true", default=default,
                   help="also print loading details, timings and progress bars")
