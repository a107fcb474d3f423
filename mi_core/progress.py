"""Progress of long work on stderr: a redrawn line on a terminal, a line per step when piped
(at most one a second, and then always the last), nothing for work done in under half a
second or when switched off.

Whether it shows: the `enabled` a caller passes; otherwise the process-wide setting
(:func:`set_progress`; the ``mi`` command sets it from ``-q``); otherwise only when stderr
is a terminal.
"""

from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
_setting: list[bool | None] = [None]


def set_progress(enabled: bool | None) -> bool | None:
    """Show progress always (True), never (False), or on a terminal only (None, the default).
    Returns the setting it replaces."""
    previous, _setting[0] = _setting[0], enabled
    return previous


def _shows(enabled: bool | None) -> bool:
    if enabled is not None:
        return enabled
    return _setting[0] if _setting[0] is not None else sys.stderr.isatty()


class Progress:
    """``with Progress(total, "patching") as bar: ... bar.update()``."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", initial: int = 0,
                 enabled: bool | None = None) -> None:
        self.total, self.desc, self.unit, self.done = total, desc, unit, initial
        self.note = ""  # shown after the count, e.g. "3 failed"
        self.shown = _shows(enabled)
        self.asked = enabled is True  # the caller asked: the last line is shown however fast
        self.tty = self.shown and sys.stderr.isatty()
        self.start = self.last = time.monotonic()
        self.written = False  # whether a line was shown (the last one then always is)

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.shown:
            return
        now = time.monotonic()
        final = self.total is not None and self.done >= self.total
        if now - self.start < 0.5 and not (final and (self.written or self.asked)):
            return  # work done in under half a second is not worth a line
        if final or now - self.last >= (0.1 if self.tty else 1.0):
            self.last, self.written = now, True
            self._write(final)

    def _write(self, final: bool) -> None:
        elapsed = time.monotonic() - self.start
        of = f"/{self.total}" if self.total is not None else ""
        rate = f", {self.done / elapsed:.1f} {self.unit}/s" if elapsed > 0 and self.done else ""
        note = f", {self.note}" if self.note else ""
        line = f"{self.desc}: {self.done}{of} {self.unit}{note} [{elapsed:.1f} s{rate}]"
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.written and self.tty and not (self.total is not None and self.done >= self.total):
            sys.stderr.write("\n")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it",
             enabled: bool | None = None) -> Iterator[T]:
    """Yield `items`, reporting each step (see the module doc for when it shows)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, desc, unit, enabled=enabled) as bar:
        for item in items:
            yield item
            bar.update()
