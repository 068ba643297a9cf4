"""The journal line codec: one event as one JSON line and back, with the line bounds every writer
keeps. The journal writes it, a Publisher's spool writes it, sinks and viewers read it; it lives on
the wire room's side so none of them needs the journal to speak it."""
from __future__ import annotations

import operator
from typing import Any, Callable, NamedTuple

import orjson

from relay.wire import schema
from sinks.events import ENVELOPE, FIELDS, RELAY_RANK, ROW_FIELDS, json_safe


#: How a Publisher names a spool file (relay/client/publisher.py): one rank's journal lines, none of
#: them the relay's own, which ``relay replay`` derives as it journals them (relay/daemon/rederive.py).
SPOOL_SUFFIX = ".spool.jsonl"


class Derived(NamedTuple):
    """One event to publish as the relay (relay/daemon/cross_rank.py derives them): ``relay_event``
    adds the envelope (seq, host, ts)."""

    run: str
    world_size: int
    type: str
    step: int | None
    epoch: float | None
    data: dict[str, Any]


def relay_event(item: Derived, seq: int, host: str, ts: float) -> dict[str, Any]:
    """One of the relay's own events as it is journaled (rank RELAY_RANK, stage ``cluster``)."""
    return {"v": schema.SCHEMA_VERSION, "run": item.run, "rank": RELAY_RANK, "local_rank": 0,
            "world_size": item.world_size, "host": host, "seq": seq, "ts": ts, "type": item.type, "step": item.step,
            "epoch": item.epoch, "stage": "cluster", "data": item.data}


def encode_line(event: dict[str, Any]) -> bytes:
    """One event as one JSON line; non-finite floats become "NaN"/"Infinity"/"-Infinity"."""
    line = orjson.dumps(event, default=str, option=orjson.OPT_APPEND_NEWLINE)
    if b"null" in line:  # orjson writes NaN/inf as null; only then pay for the walk
        line = orjson.dumps(json_safe(event), default=str, option=orjson.OPT_APPEND_NEWLINE)
    return line


def encode_lines(events: list[dict[str, Any]]) -> bytes:
    """encode_line for a batch of events, joined: one scan for non-finite floats instead of one per event."""
    chunk = b"".join([orjson.dumps(e, default=str, option=orjson.OPT_APPEND_NEWLINE) for e in events])
    if b"null" in chunk:
        return b"".join([encode_line(e) for e in events])
    return chunk


def check_lines(lines: bytes | list[bytes]) -> None:
    """Refuse one frame's journal lines (a chunk, or one per event) if a line is longer than
    ``schema.MAX_LINE_BYTES`` or all are more than ``schema.MAX_FRAME_LINES_BYTES``: FrameError,
    reason ``bad_value``. A chunk no longer than one line may be costs one comparison."""
    if type(lines) is bytes:
        if len(lines) <= schema.MAX_LINE_BYTES:
            return
        total, longest = len(lines), max(map(len, lines.split(b"\n"))) + 1
    else:
        total, longest = sum(map(len, lines)), max(map(len, lines), default=0)
    if longest > schema.MAX_LINE_BYTES:
        raise schema.FrameError("bad_value", f"an event's journal line would be {longest} bytes, over "
                                             f"{schema.MAX_LINE_BYTES} (JSON escapes a control character in 6)")
    if total > schema.MAX_FRAME_LINES_BYTES:
        raise schema.FrameError("bad_value", f"the frame's journal lines would be {total} bytes, over "
                                             f"{schema.MAX_FRAME_LINES_BYTES}")


def parse_line(line: bytes) -> dict[str, Any] | None:
    """The event a journal line holds, as written (non-finite metrics still strings); None for a
    line that is not a JSON object."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return event if type(event) is dict else None


#: Fields a line may leave out and still be an event (a journal written by hand or by another tool),
#: with what they are checked as; the event itself is handed on as written.
OPTIONAL_FIELDS: dict[str, Any] = {"v": schema.SCHEMA_VERSION, "local_rank": 0, "world_size": 1, "host": "",
                                   "step": None, "epoch": None, "stage": None}
_FIELD_SET = frozenset(FIELDS)


def event_error(event: dict[str, Any]) -> str | None:
    """Why a parsed journal line is not an event, or None if it is: every field the relay would
    have accepted (``relay.wire.schema.validate_event``: the run id names a file, rank and seq are ints
    in range, ts is unix seconds, ...), no unknown field, and only OPTIONAL_FIELDS missing.

    What every reader relies on; a journal written by an older relay may hold a ts or epoch of
    "NaN" (or seqs beyond 2**63), which no longer is an event."""
    if event.keys() != _FIELD_SET:
        missing = _FIELD_SET.difference(event)
        event = {**{k: OPTIONAL_FIELDS[k] for k in missing.intersection(OPTIONAL_FIELDS)}, **event}
    try:
        schema.validate_event(event)
    except schema.FrameError as exc:
        return str(exc)
    return None


def parse_event(line: bytes) -> dict[str, Any] | None:
    """The event a journal line holds (non-finite metrics still strings), with any missing optional
    field at its default, so a sink always gets the whole envelope; None for a line that is not one
    (not a JSON object, or see ``event_error``). The one test every reader of events applies."""
    event = parse_line(line)
    if event is None or event_error(event) is not None:
        return None
    if event.keys() != _FIELD_SET:
        event = {**{k: OPTIONAL_FIELDS[k] for k in _FIELD_SET.difference(event)}, **event}
    return event


MAX_ENVELOPES = 4096
_ENVELOPE_KEY = operator.itemgetter(*ENVELOPE)
_ROW_KEY = operator.itemgetter(*ROW_FIELDS)
_FIELD_COUNT = len(FIELDS)
NOT_AN_EVENT = "not a JSON object with the fields of an event"

Checked = tuple[bytes, dict[str, Any], tuple, list[Any]]  # (line as written, event, envelope, row)


class ChunkCheck:
    """``parse_event`` for a chunk of journal lines at once, at a fraction of its cost: the lines
    are the relay's own, validated when they arrived, so the common line costs one orjson parse, and
    the chunk one column check (``schema.rows_pass``, a relay's own rules for a compact batch); only
    a line that fails it, or whose envelope is new, goes through ``event_error`` alone. The forward
    sink and the consuming relays read journal lines with it. ``bad(line, why)`` hears of each line
    that is not an event (a line ``parse_event`` refuses), once (those the column check finds last)."""

    def __init__(self, bad: Callable[[bytes, str], None]) -> None:
        self.bad = bad
        self._envelopes: set[tuple] = set()  # envelopes event_error passed

    def events(self, lines: list[bytes], run: str | None = None) -> list[Checked]:
        """The events of ``lines`` (those of ``run`` only, if given), in order, each checked."""
        loads, envelopes, items = orjson.loads, self._envelopes, []
        for line in lines:
            try:  # a line of every field and no other (KeyError, TypeError: not a map of them all)
                event = loads(line)
                envelope, row = _ENVELOPE_KEY(event), _ROW_KEY(event)
                whole = len(event) == _FIELD_COUNT
            except (orjson.JSONDecodeError, KeyError, TypeError):
                whole = False
            if not whole:
                event = parse_event(line)  # fills optional fields; None: not an event
                if event is None:
                    self.bad(line, NOT_AN_EVENT)
                    continue
                envelope, row = _ENVELOPE_KEY(event), _ROW_KEY(event)
            if run is not None and envelope[1] != run:
                continue  # another run's line in this run's file (as JournalReader.read skips it)
            if envelope not in envelopes or not (type(envelope[0]) is type(envelope[2]) is type(envelope[3])
                                                 is type(envelope[4]) is int):  # (True == 1: a known one may match)
                error = event_error(event)
                if error is not None:
                    self.bad(line, error)
                    continue
                if len(envelopes) >= MAX_ENVELOPES:
                    envelopes.clear()
                envelopes.add(envelope)
            items.append((line, event, envelope, list(row)))
        if not schema.rows_pass([item[3] for item in items]):
            items = [item for item in items if self._valid(item)]
        return items

    def _valid(self, item: Checked) -> bool:
        """Whether one line of a chunk whose columns did not pass is an event, by event_error itself."""
        error = event_error(item[1])
        if error is not None:
            self.bad(item[0], error)
        return error is None
