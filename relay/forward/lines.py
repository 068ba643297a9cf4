"""The forward sink's reading of journal lines: which lines are events, and each event as what is
sent, (envelope, compact prefix, row). No sockets, no window: relay/forward/sender.py holds what this
gives.

Which lines are events is ``relay.wire.lines.ChunkCheck``'s answer (each line decoded and checked
in C, relay/wire/typed_lines.py), the consuming relays' own. A line that is not an event is reported
and never sent: one such line in a batch would make the central refuse the whole batch. Non-finite
metrics ("NaN" strings in the journal) are sent as the floats the rank sent (``from_json_metrics``),
so the central's own consumers see numbers and its journal writes the node's very line.
"""
from __future__ import annotations

from typing import Callable

from relay.wire import encoding
from relay.wire.lines import ChunkCheck
from sinks.events import ENVELOPE, from_json_metrics

MAX_PREFIXES = 4096

Item = tuple[tuple, bytes, tuple]  # (envelope, its compact prefix, row)


class LineReader:
    """Journal lines -> forwardable events; ``bad(line, why)`` hears of each line that is not one."""

    def __init__(self, bad: Callable[[bytes, str], None]) -> None:
        self.check = ChunkCheck(bad)
        self._prefixes: dict[tuple, bytes] = {}

    def events(self, lines: list[bytes], run: str | None) -> list[Item]:
        """The events of ``lines`` (those of ``run`` only, if given), in order, each checked."""
        prefixes, items = self._prefixes, []
        blob = b"".join(lines)
        nonfinite = b'"NaN"' in blob or b'Infinity"' in blob  # one scan for the chunk, not one per line
        for line, envelope, row in self.check.events(lines, run):
            if nonfinite and row[2] == "metrics" and (b'"NaN"' in line or b'Infinity"' in line):
                row = (*row[:6], from_json_metrics(row[6]))
            items.append((envelope, prefixes.get(envelope) or self._prefix(envelope), row))
        return items

    def _prefix(self, envelope: tuple) -> bytes:
        if len(self._prefixes) >= MAX_PREFIXES:
            self._prefixes.clear()
        prefix = self._prefixes[envelope] = encoding.compact_prefix(dict(zip(ENVELOPE, envelope)))
        return prefix
