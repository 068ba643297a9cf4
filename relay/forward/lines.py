"""The forward sink's reading of journal lines: which lines are events (``ChunkCheck``, the
consuming relays' own answer), each as what is sent, grouped by envelope. No sockets, no window.

A line that is not an event is reported and never sent: one in a batch would make the central refuse
the whole batch. Non-finite metrics go as the floats the rank sent, so the central's journal writes
the node's very line.
"""
from __future__ import annotations

from collections.abc import Callable

from relay.wire import encoding
from relay.wire.lines import ChunkCheck
from sinks.events import ENVELOPE, from_json_metrics

MAX_PREFIXES = 4096

# (envelope, its compact prefix, its events' rows in order)
Group = tuple[tuple, bytes, list[tuple]]


def non_finite(text: bytes) -> bool:
    """Whether ``text`` may hold a non-finite metric as the journal writes one ("NaN", "Infinity",
    "-Infinity"). A look for one letter first (memchr): 40 times faster than for the words, and most
    chunks have neither letter."""
    return (b"N" in text and b'"NaN"' in text) or (b"I" in text and b'Infinity"' in text)


class LineReader:
    """Journal lines -> forwardable events; ``bad(line, why)`` hears of each line that isn't."""

    def __init__(self, bad: Callable[[bytes, str], None]) -> None:
        self.check = ChunkCheck(bad)
        self._prefixes: dict[tuple, bytes] = {}

    def events(self, lines: list[bytes], run: str | None) -> list[Group]:
        """The events of ``lines`` (those of ``run`` only, if given), checked, grouped by envelope
        (each rank's in their order)."""
        blob = b"".join(lines)
        if non_finite(blob):  # one scan for the chunk, not one per line
            groups: dict[tuple, list[tuple]] = {}
            for line, envelope, row in self.check.events(lines, run):
                if row[2] == "metrics" and non_finite(line):
                    row = (*row[:6], from_json_metrics(row[6]))
                groups.setdefault(envelope, []).append(row)
        else:
            groups = self.check.rows(lines, run)
        prefixes = self._prefixes
        return [(envelope, prefixes.get(envelope) or self._prefix(envelope), rows)
                for envelope, rows in groups.items()]

    def _prefix(self, envelope: tuple) -> bytes:
        if len(self._prefixes) >= MAX_PREFIXES:
            self._prefixes.clear()
        fields = dict(zip(ENVELOPE, envelope, strict=True))
        prefix = self._prefixes[envelope] = encoding.compact_prefix(fields)
        return prefix
