"""The journal line codec: one event as one JSON line and back, with the line bounds every writer
keeps. The journal writes it, a Publisher's spool writes it, sinks and viewers read it; it lives on
the wire room's side so none of them needs the journal to speak it.

Which lines are events is the wire's one validation engine (relay/wire/rules.py): a line is an
event when msgspec decodes it into ``Line``, the event's type with the fields a line may leave out
given their defaults; ``line_error`` says why one is not."""
from __future__ import annotations

import json
from collections.abc import Callable
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, cast

import msgspec
import orjson
from msgspec.structs import asdict

from relay.wire import schema
from relay.wire.rules import Repeated, matching, pairs_hook
from sinks.events import ENVELOPE, FIELDS, RELAY_RANK, ROW_FIELDS, json_safe

#: How a Publisher names a spool file (relay/client/publisher.py): one rank's journal lines, none of
#: them the relay's own, which ``relay replay`` derives as it journals them
#: (relay/daemon/rederive.py).
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
            "world_size": item.world_size, "host": host, "seq": seq, "ts": ts, "type": item.type,
            "step": item.step, "epoch": item.epoch, "stage": "cluster", "data": item.data}


def encode_line(event: dict[str, Any]) -> bytes:
    """One event as one JSON line; non-finite floats become "NaN"/"Infinity"/"-Infinity"."""
    line = orjson.dumps(event, default=str, option=orjson.OPT_APPEND_NEWLINE)
    if b"null" in line:  # orjson writes NaN/inf as null; only then pay for the walk
        line = orjson.dumps(json_safe(event), default=str, option=orjson.OPT_APPEND_NEWLINE)
    return line


#: The ingest's encoder: a whole frame's lines in one C call (msgspec writes a float's exponent
#: without its '+': 1e16, where orjson writes 1e+16; either reads back as the same number).
_encode_lines = msgspec.json.Encoder(enc_hook=str).encode_lines


def encode_lines(events: list[Any], finite: bool = False) -> bytes:
    """encode_line for a batch of events, joined, in one call: one scan for non-finite floats
    instead of one per event, and none where every float is ``finite`` (``schema.Frame.finite``;
    only then may ``events`` be a Frame's records, which encode_line cannot write)."""
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
        # (type() is, not isinstance: mypy keeps bytes possible here)
        listed = cast("list[bytes]", lines)
        total, longest = sum(map(len, listed)), max(map(len, listed), default=0)
    if longest > schema.MAX_LINE_BYTES:
        raise schema.FrameError("bad_value",
                                f"an event's journal line would be {longest} bytes, over "
                                f"{schema.MAX_LINE_BYTES} (JSON escapes a control character in 6)")
    if total > schema.MAX_FRAME_LINES_BYTES:
        raise schema.FrameError("bad_value",
                                f"the frame's journal lines would be {total} bytes, over "
                                f"{schema.MAX_FRAME_LINES_BYTES}")


#: Fields a line may leave out and still be an event (a journal written by hand or by another tool),
#: with what they are checked as; ``parse_event`` gives them these values.
OPTIONAL_FIELDS: dict[str, Any] = {"v": schema.SCHEMA_VERSION, "local_rank": 0, "world_size": 1,
                                   "host": "", "step": None, "epoch": None, "stage": None}
#: One journal line's event, decided as msgspec decodes it; but for the run id's pattern, which
#: msgspec would test on every line (in Python's re, costing more than the rest of the line), and
#: ``decode_lines`` tests once per run id (``matching``).
Line = schema.event_struct("Line", OPTIONAL_FIELDS, patterns=False)
_decode_line = msgspec.json.Decoder(Line).decode
_PATTERNS = [(attrgetter(f.name), matching(f.rule.pattern))
             for f in schema.EVENT_FIELDS if f.rule.pattern]
#: (v, run, rank, local_rank, world_size, host) of a Line, in one C call.
envelope_of = attrgetter(*ENVELOPE)
#: (seq, ts, type, step, epoch, stage, data) of a Line.
row_of = attrgetter(*ROW_FIELDS)
_key_of, _run_of = attrgetter("run", "rank", "seq"), attrgetter("run")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
NOT_AN_EVENT = "not a JSON object with the fields of an event"


def decode_lines(lines: list[bytes]) -> list[Any]:
    """Each journal line as a Line, or None where it is not an event (``line_error`` says why)."""
    try:
        items: list[Any] = [_decode_line(line) for line in lines]
    except msgspec.DecodeError:  # (a ValidationError too) some line is not one: line by line
        items = [_decoded(line) for line in lines]
    for value_of, unmatched in _PATTERNS:
        wrong = unmatched(set(map(value_of, filter(None, items))))
        if wrong:
            items = [None if item is None or value_of(item) in wrong else item for item in items]
    return items


def _decoded(line: bytes) -> Any:
    try:
        return _decode_line(line)
    except msgspec.DecodeError:
        return None


def parse_line(line: bytes) -> dict[str, Any] | None:
    """The JSON object a journal line holds, as written (non-finite metrics still strings), event
    or not; None for a line that is not one. Read as the types read it (numbers of any size)."""
    try:
        event = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return None
    return event if type(event) is dict else None


_FIELD_SET = frozenset(FIELDS)


def event_error(event: dict[str, Any]) -> str | None:
    """Why a parsed journal line is not an event, or None if it is: every field the relay would
    have accepted (``relay.wire.schema.validate_event``: the run id names a file, rank and seq are
    ints in range, ts is unix seconds, ...), no unknown field, and only OPTIONAL_FIELDS missing.

    What every reader relies on; a journal written by an older relay may hold a ts or epoch of
    "NaN" (or seqs beyond 2**63), which no longer is an event."""
    try:
        schema.validate_event(_filled(event))
    except schema.FrameError as exc:
        return str(exc)
    return None


def _filled(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with the OPTIONAL_FIELDS it lacks at their defaults, before its own fields."""
    if event.keys() == _FIELD_SET:
        return event
    missing = [(k, value) for k, value in OPTIONAL_FIELDS.items() if k not in event]
    return pairs_hook([*missing, *(event.pairs if type(event) is Repeated else event.items())])


def explain_line(line: bytes) -> str | None:
    """What the rules find wrong with a journal line, read as plain objects with every value of a
    key it repeats (msgspec checks each), or None: then ``decode_lines`` takes it too."""
    try:
        msgspec.json.decode(line)  # JSON as the types read it (numbers, UTF-8); then each pair
        event = json.loads(line, object_pairs_hook=pairs_hook)
    except (msgspec.DecodeError, ValueError):
        return NOT_AN_EVENT
    if not isinstance(event, dict):
        return NOT_AN_EVENT
    wrong = schema.explain_event(_filled(event))
    return None if wrong is None else str(wrong)


def line_error(line: bytes) -> str:
    """Why ``decode_lines`` refused a journal line (``explain_line``)."""
    return explain_line(line) or "invalid: refused by the types alone (a disagreement: a bug)"


def parse_event(line: bytes) -> dict[str, Any] | None:
    """The event a journal line holds (non-finite metrics still strings), in field order with any
    missing optional field at its default, so a sink always gets the whole envelope; None for a line
    that is not one (``line_error`` says why). The one test every reader of events applies."""
    item = decode_lines([line])[0]
    return None if item is None else asdict(item)


Checked = tuple[bytes, tuple, tuple]  # (line as written, envelope, row)


class ChunkCheck:
    """``parse_event`` for a chunk of journal lines at once, each line decoded and checked in C
    into its envelope and row. The forward sink and the consuming relays read journal lines with it.
    ``bad(line, why)`` hears of each line that is not an event, once."""

    def __init__(self, bad: Callable[[bytes, str], None]) -> None:
        self.bad = bad

    def events(self, lines: list[bytes], run: str | None = None) -> list[Checked]:
        """The events of ``lines`` (those of ``run`` only, if given), in order: each line as
        written, its envelope and its row (``sinks.events.ENVELOPE``, ``ROW_FIELDS``)."""
        lines, items = self._taken(lines, run)
        return list(zip(lines, map(envelope_of, items), map(row_of, items), strict=True))

    def rows(self, lines: list[bytes], run: str | None = None) -> dict[tuple, list[tuple]]:
        """The events of ``lines`` (those of ``run`` only, if given) as ``events`` has them, grouped
        by envelope: each envelope's rows, in order (what a compact batch sends). The work per line
        is all in C (a journal's lines come in runs of one envelope)."""
        items = self._taken(lines, run)[1]
        groups: dict[tuple, list[tuple]] = {}
        pairs = zip(map(envelope_of, items), map(row_of, items), strict=True)
        for envelope, same in groupby(pairs, key=_FIRST):
            rows = list(map(_SECOND, same))
            if envelope in groups:
                groups[envelope] += rows
            else:
                groups[envelope] = rows
        return groups

    def keys(self, lines: list[bytes]) -> list[tuple[bytes, tuple[str, int, int]]]:
        """The events of ``lines``, in order, as what dedupe needs: each line and its (run, rank,
        seq)."""
        lines, items = self._taken(lines, None)
        return list(zip(lines, map(_key_of, items), strict=True))

    def _taken(self, lines: list[bytes], run: str | None) -> tuple[list[bytes], list[Any]]:
        """The lines that are events (of ``run``, if given) and their Lines; ``bad`` hears of the
        others, but for another run's lines (as JournalReader.read skips them)."""
        items = decode_lines(lines)
        if None not in items and (run is None or set(map(_run_of, items)) == {run}):
            return lines, items
        taken, kept = [], []
        for line, item in zip(lines, items, strict=True):
            if item is None:
                self._refused(line, run)
            elif run is None or item.run == run:
                taken.append(line)
                kept.append(item)
        return taken, kept

    def _refused(self, line: bytes, run: str | None) -> None:
        event = parse_line(line)
        if event is None:
            self.bad(line, NOT_AN_EVENT)
        elif run is None or event.get("run") == run:
            self.bad(line, line_error(line))
