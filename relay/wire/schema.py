"""The wire format, as the relay reads it: a frame (a map, a batch, a compact batch) decoded and
validated, the relay's acks decoded, and the limits. Putting frames on the wire is
relay/wire/encoding.py; what an event is (its fields and each one's kind of value) is the event
model's, sinks/events.py; this module imports it and re-exports nothing.

One module owns the rules so the client, the daemon, replay and every test agree on them.
See docs/protocol.md for the field table and the limits. The rules are one table, ``KINDS``: what
a valid value of each kind is. Every check is derived from it (relay/wire/rules.py): the event
check of the hot path, the column-by-column fast path for compact batches, the row checks and the
message that names what is wrong, so they agree rule for rule (tests/test_compact_frames.py holds
them together) and a new field of the model needs no edit here.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple

import msgpack
import msgspec

from relay.wire.rules import Field, Rule, Rules, fields_of, remembering
from relay.wire.typed_rules import rows_of, typed
from sinks.events import ENVELOPE_KINDS, EVENT_TYPES, ROW_KINDS

SCHEMA_VERSION = 1

MAX_FRAME_BYTES = 1 << 20  # larger frames are rejected (counted, dead-lettered)
#: ZMQ_MAXMSGSIZE: beyond this the transport drops the sender's connection before the relay sees
#: anything, so a hostile peer cannot make the relay allocate without bound.
MAX_TRANSPORT_BYTES = 4 * MAX_FRAME_BYTES
#: The longest journal line (newline included) one event may make. JSON writes a control character
#: of a string in 6 bytes (``\u0001``) and ``false`` in 5, so an event's line can be 6 times its
#: bytes on the wire; an event whose line would be longer than this is refused (``bad_value``), and
#: a Publisher drops it before sending (``dropped_bad``). Every other valid event fits.
MAX_LINE_BYTES = 2 * MAX_FRAME_BYTES
#: The journal lines of one frame together (each repeats the envelope a compact batch sends once);
#: a frame past it is refused (``bad_value``). A Publisher's frames (at most 512 events) never are.
MAX_FRAME_LINES_BYTES = 16 * MAX_FRAME_BYTES
MAX_NAME_LEN = 256  # data keys, stage, host
MAX_DEPTH = 8  # nesting of data maps/lists
MAX_RANK = 1 << 24
#: seq and step stay below this, so the relay's ack (seq + 1) and every sink's int64 step fit.
MAX_SEQ = (1 << 63) - 1
#: ts is unix seconds in [0, MAX_TS] (the end of year 9999), so every reader can turn it into a date.
MAX_TS = 253402300799.0
MAX_EPOCH = 1e15  # finite, and exact as a float
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


class FrameError(ValueError):
    """A frame or event that breaks the protocol; ``reason`` is a short stable label for counters."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def valid_run_id(run: str) -> bool:
    """Run ids name files in the JSONL directory layout, so they are bounded and path-safe."""
    return isinstance(run, str) and RUN_ID_RE.match(run) is not None


class Frame(NamedTuple):
    """A decoded, valid frame.

    ``first_seq`` is set when the frame is a compact batch of one rank whose seqs run on without a
    gap from it and that holds no hello or stats event: the relay can then take it whole, with one
    comparison against the rank's dedupe floor instead of one per event. ``derive`` is set on that
    same column path when an event has stage ``rank`` (a rank's own figures, from which the relay
    derives cross-rank events) or is a ``lifecycle`` event (a ``train_end`` ends the run for that
    derivation), so the relay need not look at each event to know.
    """

    events: list[dict[str, Any]]
    first_seq: int | None = None
    derive: bool = False

    @property
    def finite(self) -> bool:
        """Whether every float in the events is known to be finite (their journal lines then need no
        look for a NaN or an infinity, which JSON cannot say)."""
        return False


class TypedFrame(Frame):
    """A Frame the typed path decoded (``_typed_batch``): its types take finite floats only."""

    __slots__ = ()

    @property
    def finite(self) -> bool:
        return True


def decode_frame(frame: bytes) -> list[dict[str, Any]]:
    """Decode and validate one frame: a single event map, an array of them, or a compact batch.

    Raises FrameError with a reason label; a frame is accepted or rejected whole, so a client
    never sees half a batch acknowledged.
    """
    return decode(frame).events


def decode(frame: bytes) -> Frame:
    """decode_frame, also saying whether the frame is one gapless run of plain events (see Frame)."""
    if len(frame) > MAX_FRAME_BYTES:
        raise FrameError("oversize", f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    typed_batch = _typed_batch(frame)
    if typed_batch is not None:
        return typed_batch
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except UnicodeDecodeError as exc:
        raise FrameError("bad_utf8", str(exc)) from None
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError) as exc:
        raise FrameError("undecodable", f"{type(exc).__name__}: {exc}") from None
    if type(obj) is dict:
        if "events" in obj:
            return _expand(obj)  # validated as it is expanded
        events = [obj]
    elif type(obj) is list:
        events = obj
        if not events:
            raise FrameError("empty", "frame holds an empty batch")
    else:
        raise FrameError("not_event", f"frame decodes to {type(obj).__name__}, not a map or array of maps")
    for event in events:
        validate_event(event)
    return Frame(events)


def _expand(frame: dict[str, Any]) -> Frame:
    """A compact batch as the events it stands for, checked by validate_event's rules: the envelope
    once, then the rows column by column (RULES.columns); only a batch that fails that is checked
    row by row, to find and name what is wrong."""
    if frame.keys() != _COMPACT_KEYS:
        missing = _COMPACT_KEYS.difference(frame)
        if missing:
            raise FrameError("missing_field", f"compact batch missing {sorted(missing)}")
        raise FrameError("unknown_field", f"compact batch has unknown {sorted(map(str, set(frame) - _COMPACT_KEYS))}")
    rows = frame["events"]
    if type(rows) is not list:
        raise FrameError("bad_type", f"compact batch events must be an array, got {type(rows).__name__}")
    if not rows:
        raise FrameError("empty", "compact batch holds no events")
    envelope = RULES.get_envelope(frame)
    checked = _columns_ok(rows)
    if checked is None:
        return Frame(_expand_checked(rows, envelope))
    first_seq, derive = checked
    events = RULES.events_of_rows(rows, *envelope)
    validate_event(events[0])  # the envelope, which every row shares
    return Frame(events, first_seq if first_seq >= 0 else None, derive)


def _columns_ok(rows: list[Any]) -> tuple[int, bool] | None:
    """A compact batch's rows checked by column (RULES.columns): None if any rule fails (the caller
    then finds out which, row by row), else ``_taken_whole``'s two answers."""
    columns = RULES.columns(rows)
    if columns is None:
        return None
    return _taken_whole(list(columns[_SEQ]), columns[_TYPE], columns[_STAGE])


def _taken_whole(seqs: list[int], types: Any, stages: Any) -> tuple[int, bool]:
    """Of a valid compact batch's columns: the first seq if the seqs run on without a gap and no row
    is a hello or stats event (else -1), and whether a row has stage ``rank`` or type ``lifecycle``."""
    first = seqs[0]
    if not (_SPECIAL_TYPES.isdisjoint(types) and seqs == list(range(first, first + len(seqs)))):
        first = -1
    return first, "rank" in stages or "lifecycle" in types


def _typed_batch(frame: bytes) -> TypedFrame | None:
    """A compact batch of flat data decoded and checked in C (``TypedBatch``: the rules as msgspec
    types, relay/wire/typed_rules.py), the run id's pattern once per run; None for any other frame,
    or one the types refuse, which is not necessarily wrong (nested data): the rules then judge it."""
    try:
        batch = _decode_typed(frame)
    except msgspec.DecodeError:  # (a ValidationError too)
        return None
    rows = batch.events
    if not rows:
        return None
    for value_of, passed, accept in _TYPED_ACCEPT:
        values = value_of(batch)
        if not values <= passed and not all(map(accept, values)):
            return None
    first, derive = _taken_whole(list(map(_ROW_SEQ, rows)), set(map(_ROW_TYPE, rows)), set(map(_ROW_STAGE, rows)))
    return TypedFrame(RULES.events_of_rows(rows, *_typed_envelope(batch)), first if first >= 0 else None, derive)


def rows_pass(rows: list[list[Any]]) -> bool:
    """Whether compact rows (lists of ROW_FIELDS' values, none nested in data) pass validate_event's
    rules, checked a column at a time as a relay checks a compact batch. False says only that one
    may not: check those one by one (relay/forward/lines.py does)."""
    return not rows or RULES.columns(rows) is not None


_SCALARS = frozenset({float, int, str, bool, type(None)})


def _flat_data(datas: list[dict]) -> bool:
    """_check_map over a column of data maps that holds no nested value (a nested one: False, for
    the row checks)."""
    # the keys as a set first: rows of one rank mostly repeat the same few keys
    return (all(type(key) is str and len(key) <= MAX_NAME_LEN for key in set(chain.from_iterable(datas)))
            and _SCALARS.issuperset(map(type, chain.from_iterable(map(dict.values, datas)))))


def _check_map(obj: dict, depth: int = 1) -> None:
    """An event's data (a map at ``depth``): string keys of at most MAX_NAME_LEN, scalar values or
    lists and maps of them, nested at most MAX_DEPTH deep."""
    if depth > MAX_DEPTH:
        raise FrameError("too_deep", f"data nested deeper than {MAX_DEPTH} levels")
    for key, val in obj.items():
        if type(key) is not str:
            raise FrameError("bad_type", f"data key {key!r} is not a string")
        if len(key) > MAX_NAME_LEN:
            raise FrameError("name_too_long", f"data key of {len(key)} chars exceeds {MAX_NAME_LEN}")
        if type(val) not in _SCALARS:  # the common flat-metrics case costs one set lookup
            _check_value(val, depth)


def _check_value(val: Any, depth: int) -> None:
    kind = type(val)
    if kind in _SCALARS:
        return
    if kind is dict:
        _check_map(val, depth + 1)
    elif kind is list:
        if depth + 1 > MAX_DEPTH:
            raise FrameError("too_deep", f"data nested deeper than {MAX_DEPTH} levels")
        for item in val:
            _check_value(item, depth + 1)
    else:
        raise FrameError("bad_type", f"data value of type {kind.__name__} is not allowed")


#: The rule table: what a valid value of each kind of field (sinks/events.py) is. Every check of an
#: event is derived from it (relay/wire/rules.py); docs/protocol.md's field table says the same.
KINDS: dict[str, Rule] = {
    "version": Rule((int,), f"schema version {SCHEMA_VERSION} (this relay's)", SCHEMA_VERSION, SCHEMA_VERSION,
                    reason="bad_version"),
    "run_id": Rule((str,), f"a run id matching {RUN_ID_RE.pattern}", accept=lambda run: RUN_ID_RE.match(run) is not None,
                   reason="bad_run"),
    "rank": Rule((int,), f"an int in [0, {MAX_RANK})", 0, MAX_RANK - 1),
    "world_size": Rule((int,), f"an int in [1, {MAX_RANK})", 1, MAX_RANK - 1),
    "name": Rule((str,), f"a string of at most {MAX_NAME_LEN} chars", max_len=MAX_NAME_LEN),
    "count": Rule((int,), f"an int in [0, {MAX_SEQ}]", 0, MAX_SEQ, over="bad_value"),
    "unix_time": Rule((int, float), f"unix seconds (a number) in [0, {MAX_TS:.0f}]", 0, MAX_TS, under="bad_value",
                      over="bad_value"),
    "event_type": Rule((str,), f"one of {sorted(EVENT_TYPES)}", among=EVENT_TYPES, reason="bad_event_type"),
    "epoch": Rule((int, float), f"a finite number within +-{MAX_EPOCH:g}", -MAX_EPOCH, MAX_EPOCH, under="bad_value",
                  over="bad_value"),
    "map": Rule((dict,), "a map", deep=_check_map, column=_flat_data),
}
RULES = Rules(ENVELOPE_KINDS, ROW_KINDS, KINDS, FrameError)
validate_event = RULES.validate_event
_expand_checked = RULES.row_checks
_COMPACT_KEYS = frozenset(RULES.envelope + ("events",))  # a compact batch: the envelope once, then rows
_SEQ, _TYPE, _STAGE = map(RULES.row.index, ("seq", "type", "stage"))
_SPECIAL_TYPES = frozenset({"hello", "stats"})  # events the relay acts on one by one

_ENVELOPE_FIELDS = fields_of(ENVELOPE_KINDS, KINDS)
_ROW_RULES = fields_of(ROW_KINDS, KINDS)
#: A compact batch as msgspec types: the envelope's fields, then its rows as tuples of the row's.
TypedBatch = msgspec.defstruct(
    "TypedBatch", [(f.name, typed(f, MAX_NAME_LEN)) for f in _ENVELOPE_FIELDS]
    + [("events", rows_of(_ROW_RULES, MAX_NAME_LEN))],
    forbid_unknown_fields=True, gc=False, module=__name__)
_decode_typed: Callable[[bytes], Any] = msgspec.msgpack.Decoder(TypedBatch).decode
_typed_envelope = attrgetter(*RULES.envelope)
_ROW_SEQ, _ROW_TYPE, _ROW_STAGE = itemgetter(_SEQ), itemgetter(_TYPE), itemgetter(_STAGE)


def _values_of(field: Field) -> Callable[[Any], set[Any]]:
    """A typed batch's values of ``field`` (nil left out): the envelope's one, or a row field's column."""
    nil = {None} if field.nullable else set()
    if field.name in RULES.envelope:
        one = attrgetter(field.name)
        return lambda batch: {one(batch)} - nil
    column = itemgetter(RULES.row.index(field.name))
    return lambda batch: set(map(column, batch.events)) - nil


#: The rules' ``accept`` tests, which the types leave out: (the field's values, those passed, the test).
_TYPED_ACCEPT = [(_values_of(f), *remembering(f.rule.accept)) for f in _ENVELOPE_FIELDS + _ROW_RULES
                 if f.rule.accept is not None]


def decode_refused(frame: bytes) -> list[tuple[str, int, str]]:
    """Client side of encode_refused: the streams refused, each (run, rank, why); FrameError on
    anything else."""
    try:
        obj = msgpack.unpackb(frame, raw=False)
        return [(str(r), int(k), str(why)) for r, k, why in obj.get("refused", ())]
    except Exception as exc:  # any malformed message is one counted protocol error for the caller
        raise FrameError("bad_ack", f"{type(exc).__name__}: {exc}") from None


def decode_ack(frame: bytes) -> list[tuple[str, int, int]]:
    """Client side of encode_ack; raises FrameError on anything else."""
    try:
        obj = msgpack.unpackb(frame, raw=False)
        return [(str(r), int(k), int(n)) for r, k, n in obj["ack"]]
    except Exception as exc:  # any malformed ack is one counted protocol error for the caller
        raise FrameError("bad_ack", f"{type(exc).__name__}: {exc}") from None
