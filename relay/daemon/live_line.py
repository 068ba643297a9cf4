"""The relay's live status line on a terminal: one line, redrawn in place, that log records and the
sink processes' own output pass above without garbling it.

Redrawing is ``\\r`` + clear-to-end-of-line + the text, cut to the terminal's width (a line that
wrapped could not be redrawn in place). Whatever else is written to the terminal goes through
``above()``: the line is cleared, the text written, the line drawn again below it. ``close()``
leaves the last line standing with a newline after it.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TextIO

from relay.daemon.status import cut

CLEAR = "\r\x1b[K"


def wanted(mode: str, stream: TextIO) -> bool:
    """``on``/``off``, or ``auto``: a terminal that can move its cursor."""
    if mode != "auto":
        return mode == "on"
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except ValueError:  # a closed stream
        return False


class LiveLine:
    """The line and the lock every writer to the terminal takes (the ingest thread draws the line;
    log records and sink output come from other threads)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.text = ""
        self.lock = threading.RLock()
        self.closed = False

    def show(self, text: str) -> None:
        """Draw ``text`` in place, cut to ``width()``: a caller able to say less says it in that."""
        with self.lock:
            if self.closed:
                return
            width = self.width()
            self.text = cut(text, width)
            self._write(CLEAR + self.text)

    def above(self, write: Callable[[], None]) -> None:
        """Run ``write`` (which ends its output with a newline) with the line out of its way."""
        with self.lock:
            drawn = bool(self.text) and not self.closed
            if drawn:
                self._write(CLEAR)
            write()
            if drawn:
                self._write(self.text)

    def write_above(self, data: bytes) -> None:
        """Lines another process wrote (a sink's stderr), passed on above the line."""
        text = data.decode("utf-8", "replace")
        self.above(lambda: self._write(text if text.endswith("\n") else text + "\n"))

    def close(self) -> None:
        """Leave the last line as it stands, ended by a newline; nothing is redrawn from now on."""
        with self.lock:
            if self.text and not self.closed:
                self._write("\n")
            self.closed = True

    def width(self) -> int:
        """The columns a line may take: the terminal's but the last (some terminals wrap it)."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):
            columns = 0
        return max(4, columns - 1) if columns else 199  # (0: a terminal that never said its size)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError:  # the terminal is gone (closed window): stop drawing, the relay goes on
            self.closed = True


class LiveLogHandler(logging.StreamHandler):
    """A stderr log handler that writes each record above the live line."""

    def __init__(self, live: LiveLine) -> None:
        super().__init__(live.stream)
        self.live = live

    def emit(self, record: logging.LogRecord) -> None:
        self.live.above(lambda: super(LiveLogHandler, self).emit(record))
