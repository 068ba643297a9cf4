"""The journal line codec: one event as one JSON line and back, with the line bounds every writer
keeps. The journal writes it, a Publisher's spool writes it, sinks and viewers read it; it lives on
the wire room's side so none of them needs the journal to speak it."""
from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from itertools import groupby
from typing import Any, NamedTuple, cast

import msgspec
import orjson

from relay.wire import schema, typed_lines
from relay.wire.typed_lines import OPTIONAL_FIELDS
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


#: The ingest's encoder: a whole frame's lines in one C call (msgspec writes a float's exponent
#: without its '+': 1e16, where orjson writes 1e+16; either reads back as the same number).
_encode_lines = msgspec.json.Encoder(enc_hook=str).encode_lines


def encode_lines(events: list[dict[str, Any]], finite: bool = False) -> bytes:
    """encode_line for a batch of events, joined, in one call: one scan for non-finite floats
    instead of one per event, and none where every float is ``finite`` (``schema.Frame.finite``)."""
    chunk = _encode_lines(events)
    if not finite and b"null" in chunk:
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
        listed = cast("list[bytes]", lines)  # (type() is, not isinstance: mypy keeps bytes possible here)
        total, longest = sum(map(len, listed)), max(map(len, listed), default=0)
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


_ENVELOPE_KEY = operator.itemgetter(*ENVELOPE)
_ROW_KEY = operator.itemgetter(*ROW_FIELDS)
_DEDUPE_KEY = operator.itemgetter("run", "rank", "seq")
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
NOT_AN_EVENT = "not a JSON object with the fields of an event"

Checked = tuple[bytes, tuple, tuple]  # (line as written, envelope, row)


class ChunkCheck:
    """``parse_event`` for a chunk of journal lines at once, at a fraction of its cost: each line is
    decoded and checked in C (relay/wire/typed_lines.py); only a line that refuses, which is not
    necessarily wrong (nested data, say), is read by ``parse_event`` itself. The forward sink and the
    consuming relays read journal lines with it. ``bad(line, why)`` hears of each line that is not
    an event (a line ``parse_event`` refuses), once."""

    def __init__(self, bad: Callable[[bytes, str], None]) -> None:
        self.bad = bad

    def events(self, lines: list[bytes], run: str | None = None) -> list[Checked]:
        """The events of ``lines`` (those of ``run`` only, if given), in order: each line as written,
        its envelope and its row (``sinks.events.ENVELOPE``, ``ROW_FIELDS``)."""
        envelope_of, row_of = typed_lines.envelope_of, typed_lines.row_of
        out = []
        for line, item in zip(lines, typed_lines.decode(lines), strict=True):
            if item is None:
                event = self._slow(line, run)
                if event is not None:
                    out.append((line, _ENVELOPE_KEY(event), _ROW_KEY(event)))
            elif run is None or item.run == run:
                out.append((line, envelope_of(item), row_of(item)))
        return out

    def rows(self, lines: list[bytes], run: str | None = None) -> dict[tuple, list[tuple]]:
        """The events of ``lines`` (those of ``run`` only, if given) as ``events`` has them, grouped
        by envelope: each envelope's rows, in order (what a compact batch sends). Where every line
        decodes, the work per line is all in C (a journal's lines come in runs of one envelope)."""
        items = typed_lines.decode(lines)
        if None in items or (run is not None and set(map(typed_lines.run_of, items)) != {run}):
            pairs: Iterable[tuple[tuple, tuple]] = [(envelope, row) for _, envelope, row in self.events(lines, run)]
        else:
            pairs = zip(map(typed_lines.envelope_of, items), map(typed_lines.row_of, items),
                        strict=True)
        groups: dict[tuple, list[tuple]] = {}
        for envelope, same in groupby(pairs, key=_FIRST):
            rows = list(map(_SECOND, same))
            if envelope in groups:
                groups[envelope] += rows
            else:
                groups[envelope] = rows
        return groups

    def keys(self, lines: list[bytes]) -> list[tuple[bytes, tuple[str, int, int]]]:
        """The events of ``lines``, in order, as what dedupe needs: each line and its (run, rank, seq)."""
        key_of = typed_lines.key_of
        out = []
        for line, item in zip(lines, typed_lines.decode(lines), strict=True):
            if item is not None:
                out.append((line, key_of(item)))
            elif (event := self._slow(line, None)) is not None:
                out.append((line, _DEDUPE_KEY(event)))
        return out

    def _slow(self, line: bytes, run: str | None) -> dict[str, Any] | None:
        """parse_event for one line the typed decoding refused: its event (None: not one, or of
        another run than ``run``; ``bad`` hears of the first kind)."""
        event = parse_line(line)
        if event is None:
            self.bad(line, NOT_AN_EVENT)
            return None
        if run is not None and event.get("run") != run:
            return None  # another run's line in this run's file (as JournalReader.read skips it)
        error = event_error(event)
        if error is not None:
            self.bad(line, error)
            return None
        return {**{k: OPTIONAL_FIELDS[k] for k in _FIELD_SET.difference(event)}, **event}
