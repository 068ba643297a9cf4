"""The forward sink's reading of journal lines: which lines are events, and each event as what is
sent, (envelope, compact prefix, row). No sockets, no window: relay/forward/sender.py holds what this
gives.

The journal's lines are the relay's own, validated when they arrived, so the common line costs one
orjson parse, and a chunk of lines one column check (``relay.wire.schema.rows_pass``, the central's own
rules for a compact batch); only a line that fails it, or whose envelope is new, goes through
``validate_event`` alone. A line that is not an event is reported and never sent: one such line in a
batch would make the central refuse the whole batch. Non-finite metrics ("NaN" strings in the
journal) are sent as the floats the rank sent (``sinks.events.from_journal``), so the central's own
consumers see numbers and its journal writes the node's very line.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import orjson

from relay.wire import encoding, schema
from relay.wire.lines import event_error, parse_event
from sinks.events import ENVELOPE, FIELDS, ROW_FIELDS, from_journal

MAX_PREFIXES = 4096
_FIELD_COUNT = len(FIELDS)
_envelope = operator.itemgetter(*ENVELOPE)
_row = operator.itemgetter(*ROW_FIELDS)

Item = tuple[tuple, bytes, list[Any]]  # (envelope, its compact prefix, row)


class LineReader:
    """Journal lines -> forwardable events; ``bad(line, why)`` hears of each line that is not one."""

    def __init__(self, bad: Callable[[bytes, str], None]) -> None:
        self.bad = bad
        self._prefixes: dict[tuple, bytes] = {}

    def events(self, lines: list[bytes], run: str | None) -> list[Item]:
        """The events of ``lines`` (those of ``run`` only, if given), in order, each checked."""
        loads, prefixes, items = orjson.loads, self._prefixes, []
        blob = b"".join(lines)
        nonfinite = b'"NaN"' in blob or b'Infinity"' in blob  # one scan for the chunk, not one per line
        for line in lines:
            try:  # a line of every field and no other (KeyError, TypeError: not a map of them all)
                event = loads(line)
                envelope, row = _envelope(event), _row(event)
                whole = len(event) == _FIELD_COUNT
            except (orjson.JSONDecodeError, KeyError, TypeError):
                whole = False
            if not whole:
                event = parse_event(line)  # fills optional fields; None: not an event
                if event is None:
                    self.bad(line, "not a JSON object with the fields of an event")
                    continue
                envelope, row = _envelope(event), _row(event)
            if run is not None and envelope[1] != run:
                continue  # another run's line in this run's file (as JournalReader.read skips it)
            if nonfinite and event["type"] == "metrics" and (b'"NaN"' in line or b'Infinity"' in line):
                row = _row(from_journal(event))
            prefix = prefixes.get(envelope)
            if prefix is None or not (type(envelope[0]) is type(envelope[2]) is type(envelope[3])
                                      is type(envelope[4]) is int):  # (True == 1: a cached key may match)
                error = event_error(event)
                if error is not None:
                    self.bad(line, error)
                    continue
                prefix = prefixes.get(envelope) or self._prefix(envelope)
            items.append((envelope, prefix, list(row)))
        if not schema.rows_pass([row for _, _, row in items]):
            items = [item for item in items if self._valid(item)]
        return items

    def _valid(self, item: Item) -> bool:
        """Whether one row (with its envelope) is an event, by validate_event itself."""
        envelope, _, row = item
        event = {**dict(zip(ENVELOPE, envelope)), **dict(zip(ROW_FIELDS, row))}
        error = event_error(event)
        if error is not None:
            self.bad(orjson.dumps(event, default=str), error)
        return error is None

    def _prefix(self, envelope: tuple) -> bytes:
        if len(self._prefixes) >= MAX_PREFIXES:
            self._prefixes.clear()
        prefix = self._prefixes[envelope] = encoding.compact_prefix(dict(zip(ENVELOPE, envelope)))
        return prefix
