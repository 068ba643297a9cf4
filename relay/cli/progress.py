"""How far a long ``relay replay`` has got: a bar on a terminal, a log line every ``every`` seconds
elsewhere, and what to say when stopped part way. The share and time left are in bytes of the files
given, the one total known before reading.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from relay.daemon.live_line import LiveLine
from relay.journal.reader import journal_files

log = logging.getLogger("relay.replay")

#: Seconds between two redraws of the bar.
DRAW_S = 0.2
BAR = 20


class Progress:
    """``update(events, done_bytes)`` after each batch; ``line`` (a LiveLine on a terminal) or a log
    record every ``every`` seconds shows it. ``clock`` is time.monotonic (a test gives its own)."""

    def __init__(self, total_bytes: int, *, line: LiveLine | None, every: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total_bytes
        self.line = line
        self.every = every
        self.clock = clock
        self.events = 0
        self.done = 0
        self.started = clock()
        self._shown = self.started

    def update(self, events: int, done_bytes: int) -> None:
        self.events, self.done = events, done_bytes
        now = self.clock()
        if now - self._shown < (DRAW_S if self.line is not None else self.every):
            return
        self._shown = now
        if self.line is not None:
            self.line.show(self.bar(now))
        else:
            log.info("%s", self.text(now))

    def close(self) -> None:
        """Leave the last bar standing (what follows goes below it)."""
        if self.line is not None:
            self.line.show(self.bar(self.clock()))
            self.line.close()

    @property
    def share(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 1.0

    def text(self, now: float) -> str:
        """``350,000 events, 35% of 246 MB, 52,000 ev/s, about 12 s left``."""
        rate = self.events / max(now - self.started, 1e-9)
        text = f"{self.events:,} events, {self.share:.0%} of {_size(self.total)}, {rate:,.0f} ev/s"
        left = self._left(now)
        return text + (f", about {_duration(left)} left" if left is not None else "")

    def bar(self, now: float) -> str:
        """``replay [#######.............] 35% 350,000 events 52,000 ev/s ETA 0:12``."""
        filled = round(self.share * BAR)
        rate = self.events / max(now - self.started, 1e-9)
        left = self._left(now)
        return (f"replay [{'#' * filled}{'.' * (BAR - filled)}] {self.share:4.0%} "
                f"{self.events:,} events {rate:,.0f} ev/s "
                f"ETA {_duration(left) if left is not None else '?'}")

    def said(self) -> str:
        """How far it got, for the line that ends an interrupted replay."""
        return f"{self.events:,} events ({self.share:.0%} of {_size(self.total)})"

    def _left(self, now: float) -> float | None:
        elapsed = now - self.started
        if not self.done or elapsed <= 0:
            return None
        return (self.total - self.done) * elapsed / self.done


def size_of(paths: Iterable[Path]) -> int:
    """The bytes of the journal files ``paths`` stand for (files, or directories of run files)."""
    total = 0
    for file in (f for path in paths for f in journal_files(Path(path))):
        try:
            total += file.stat().st_size
        except OSError:  # gone since it was named: the replay says so when it reads it
            continue
    return total


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{n} bytes"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
