"""What a command prints and writes: results on stdout unless ``-q``, details with
``--verbose``, progress on stderr (mi-core's progress reporter), ``--json`` and ``--plot``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable


class Console:
    """stdout of one command: results unless ``--quiet``, details only with ``--verbose``."""

    quiet = False
    verbose = False

    def configure(self, args: argparse.Namespace) -> None:
        self.quiet = bool(getattr(args, "quiet", False))
        self.verbose = bool(getattr(args, "verbose", False)) and not self.quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text)

    def detail(self, text: str) -> None:
        if self.verbose:
            print(text)

    def step(self, text: str) -> None:
        """One line of progress on stderr ("mi: loading ..."), also when piped (a line per
        step, never a redrawn bar); silenced by ``-q``."""
        if not self.quiet:
            print(f"mi: {text}", file=sys.stderr, flush=True)


console = Console()


def num(x: float | None, spec: str = ".4f") -> str:
    """`x` formatted with `spec`, never as negative zero ("-0.0000" -> "0.0000")."""
    if x is None:
        return "-"
    s = format(float(x), spec)
    if float(s) == 0.0:  # "-0.000" (a tiny negative) or "-0.0"
        s = format(0.0, spec)
    return s


def write_plot(out: str | None, make_picture: Callable[[Path], Any],
               html: Callable[[Path], Any] | None = None) -> None:
    """--plot OUT: a picture by extension, or the interactive page `html` for .html."""
    if out is None:
        return
    path = Path(out)
    if path.suffix.lower() == ".html":
        if html is None:
            raise CommandError(f"--plot {out}: this command has no interactive view; use "
                               ".png, .svg or .pdf")
        html(path)
    else:
        make_picture(path)
    console.say(f"wrote {path}")


def html_of(result: Any, **kw: Any) -> Callable[[Path], Any] | None:
    """The result's interactive view (``result.to_html(path)``), when it has one."""
    fn = getattr(result, "to_html", None)
    return None if fn is None else (lambda p: fn(p, **kw))


def write_json(out: str | None, result: Any, raw: bool = True) -> None:
    """--json OUT: the result through mi-core's serialiser (``mi_core.from_json`` reads it)."""
    if out is not None:
        from mi_core import to_json

        to_json(result, out, raw=raw)
        console.say(f"wrote {out}")


class CommandError(Exception):
    """A command cannot do what was asked: ``mi: error: <message>``, exit code 1."""
