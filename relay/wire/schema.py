"""The wire format, as the relay reads it: a frame (a map, a batch, a compact batch) decoded and
validated, the relay's acks decoded, and the limits. Putting frames on the wire is
relay/wire/encoding.py; what an event is (its fields and each one's kind of value) is the event
model's, sinks/events.py; this module imports it and re-exports nothing.

One module owns the rules so the client, the daemon, replay and every test agree on them
(docs/protocol.md has the field table and the limits). The rules are one table, ``KINDS``, from
which relay/wire/rules.py makes the one validation engine; a new field of the model needs no edit
here.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import starmap
from operator import attrgetter, itemgetter
from typing import Annotated, Any, overload

import msgpack
import msgspec
from msgspec import Meta
from msgspec.structs import asdict

from relay.wire.rules import Repeated, Rule, explain, fields_of, pairs_hook, typed
from sinks.events import ENVELOPE, ENVELOPE_KINDS, EVENT_TYPES, ROW_FIELDS, ROW_KINDS

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
#: ts is unix seconds in [0, MAX_TS] (the end of year 9999), so every reader can turn it into a
#: date.
MAX_TS = 253402300799.0
MAX_EPOCH = 1e15  # finite, and exact as a float
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


class FrameError(ValueError):
    """A frame or event that breaks the protocol; ``reason`` is a short stable label for
    counters."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def valid_run_id(run: str) -> bool:
    """Run ids name files in the JSONL directory layout, so they are bounded and path-safe."""
    return isinstance(run, str) and RUN_ID_RE.match(run) is not None


#: The rule table: what a valid value of each kind of field (sinks/events.py) is. The types that
#: decide and the explainer are both made from it (relay/wire/rules.py); docs/protocol.md's field
#: table says the same.
KINDS: dict[str, Rule] = {
    "version": Rule((int,), f"schema version {SCHEMA_VERSION} (this relay's)", SCHEMA_VERSION,
                    SCHEMA_VERSION, reason="bad_version"),
    "run_id": Rule((str,), f"a run id matching {RUN_ID_RE.pattern}",
                   pattern=f"^{RUN_ID_RE.pattern}", reason="bad_run"),
    "rank": Rule((int,), f"an int in [0, {MAX_RANK})", 0, MAX_RANK - 1),
    "world_size": Rule((int,), f"an int in [1, {MAX_RANK})", 1, MAX_RANK - 1),
    "name": Rule((str,), f"a string of at most {MAX_NAME_LEN} chars", max_len=MAX_NAME_LEN),
    "count": Rule((int,), f"an int in [0, {MAX_SEQ}]", 0, MAX_SEQ, over="bad_value"),
    "unix_time": Rule((int, float), f"unix seconds (a number) in [0, {MAX_TS:.0f}]", 0, MAX_TS,
                      under="bad_value", over="bad_value"),
    "event_type": Rule((str,), f"one of {sorted(EVENT_TYPES)}", among=EVENT_TYPES,
                       reason="bad_event_type"),
    "epoch": Rule((int, float), f"a finite number within +-{MAX_EPOCH:g}", -MAX_EPOCH, MAX_EPOCH,
                  under="bad_value", over="bad_value"),
    "map": Rule((dict,), "a map", max_len=MAX_NAME_LEN, depth=MAX_DEPTH),
}
#: Every field of an event with its rule, in the model's order (the envelope, then the row).
EVENT_FIELDS = fields_of({**ENVELOPE_KINDS, **ROW_KINDS}, KINDS)
_ENVELOPE_FIELDS, _ROW_FIELDS = EVENT_FIELDS[:len(ENVELOPE)], EVENT_FIELDS[len(ENVELOPE):]


def event_struct(name: str, defaults: dict[str, Any] | None = None, patterns: bool = True) -> Any:
    """An event as a msgspec type: its fields in order, each of its rule's type; ``defaults``: the
    fields a reader may leave out (keyword only, then), with their values; ``patterns``: see
    relay/wire/rules.py ``typed``."""
    defaults = defaults or {}
    fields = [(f.name, typed(f, patterns=patterns), *([defaults[f.name]] if f.name in defaults else
                                                       [])) for f in EVENT_FIELDS]
    return msgspec.defstruct(name, fields, kw_only=bool(defaults), forbid_unknown_fields=True,
                             gc=False, module=__name__)


def _batch_struct(name: str, finite: bool) -> Any:
    """A compact batch as a msgspec type: the envelope's fields, then ``events``, its rows (at least
    one), each a tuple of the row's fields."""
    row = tuple.__class_getitem__(tuple(typed(f, finite) for f in _ROW_FIELDS))
    rows: Any = Annotated[list.__class_getitem__(row), Meta(min_length=1)]
    fields = [(f.name, typed(f, finite)) for f in _ENVELOPE_FIELDS] + [("events", rows)]
    return msgspec.defstruct(name, fields, forbid_unknown_fields=True, gc=False, module=__name__)


#: One event of a frame, decided: what a map frame decodes to, what a compact batch's rows become.
Event = event_struct("Event")
#: The deciders of a frame, in the order they are tried: a compact batch of finite floats (its
#: journal lines then need no look for a NaN, which JSON cannot say), any compact batch, then a map
#: or an array of maps. What none takes, ``explain_frame`` says why.
_BATCHES = [(msgspec.msgpack.Decoder(_batch_struct("FiniteBatch", True)).decode, True),
            (msgspec.msgpack.Decoder(_batch_struct("Batch", False)).decode, False)]
_MAPS: Any = Event | Annotated[list[Event], Meta(min_length=1)]  # type: ignore[valid-type]
_decode_maps = msgspec.msgpack.Decoder(_MAPS).decode
_envelope_of = attrgetter(*ENVELOPE)
_stream_of = attrgetter("run", "rank")
_SEQ, _TYPE, _STAGE = map(itemgetter, map(ROW_FIELDS.index, ("seq", "type", "stage")))
_SPECIAL_TYPES = frozenset({"hello", "stats"})  # events the relay acts on one by one
_COMPACT_KEYS = frozenset((*ENVELOPE, "events"))  # a compact batch: the envelope once, then rows


class Frame:
    """A decoded, valid frame: its events as the types took them (``records``, msgspec structs),
    and as dicts in field order (``events``, made on first use: the relay journals a compact batch
    from its records, and needs dicts only to derive from events or watch a run's health).

    ``first_seq`` is set when the frame is a compact batch of one rank whose seqs run on without a
    gap from it and that holds no hello or stats event: the relay can then take it whole, with one
    comparison against the rank's dedupe floor instead of one per event. ``derive`` is set on that
    same path when an event has stage ``rank`` (a rank's own figures, from which the relay derives
    cross-rank events) or is a ``lifecycle`` event (a ``train_end`` ends the run for that
    derivation), so the relay need not look at each event to know. ``finite``: every float in the
    events is known to be finite (their journal lines then need no look for a NaN or an infinity).
    """

    __slots__ = ("records", "first_seq", "derive", "finite", "_events", "_first")

    def __init__(self, records: list[Any], first_seq: int | None = None, derive: bool = False,
                 finite: bool = False) -> None:
        self.records, self.first_seq, self.derive, self.finite = records, first_seq, derive, finite
        self._events: list[dict[str, Any]] | None = None
        self._first: dict[str, Any] | None = None

    @property
    def events(self) -> list[dict[str, Any]]:
        if self._events is None:
            self._events = list(map(asdict, self.records))
        return self._events

    @property
    def first(self) -> dict[str, Any]:
        """The first event, as a dict (without making the others)."""
        if self._first is None:
            self._first = self._events[0] if self._events is not None else asdict(self.records[0])
        return self._first

    @property
    def read_back(self) -> Sequence[dict[str, Any]]:
        """The events as a sequence that makes each dict as it is read: for a reader of a few (a
        run's health reads the last ones)."""
        return self._events if self._events is not None else _Read(self.records)

    def to_derive(self) -> list[dict[str, Any]]:
        """The events ``derive`` is about (stage ``rank``, or a lifecycle event), as dicts, in
        order."""
        return [asdict(r) for r in self.records if r.stage == "rank" or r.type == "lifecycle"]

    def streams(self) -> set[tuple[str, int]]:
        """The (run, rank) streams the frame sends for (one, on the ``first_seq`` path)."""
        if self.first_seq is not None:
            return {_stream_of(self.records[0])}
        return set(map(_stream_of, self.records))


class _Read(Sequence[dict[str, Any]]):
    """Frame.read_back of records not made into dicts yet."""

    def __init__(self, records: list[Any]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return list(map(asdict, self.records[index]))
        return asdict(self.records[index])


def decode_frame(frame: bytes) -> list[dict[str, Any]]:
    """Decode and validate one frame: a single event map, an array of them, or a compact batch.
    Raises FrameError with a reason label; a frame is accepted or rejected whole, so a client never
    sees half a batch acknowledged."""
    return decode(frame).events


def decode(frame: bytes) -> Frame:
    """decode_frame, as a Frame: the types decide (in C, as msgspec decodes); a frame they refuse,
    ``explain_frame`` says why."""
    if len(frame) > MAX_FRAME_BYTES:
        raise FrameError("oversize", f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    for decode_batch, finite in _BATCHES:
        try:
            return _compact(decode_batch(frame), finite)
        except msgspec.DecodeError:  # (a ValidationError too)
            continue
    try:
        decoded = _decode_maps(frame)
    except msgspec.DecodeError as exc:
        raise _refusal(frame, exc) from None
    return Frame(decoded if type(decoded) is list else [decoded])


def _compact(batch: Any, finite: bool) -> Frame:
    """A compact batch the types took, as its events, with its first seq and derive (see Frame)."""
    rows = batch.events
    records = list(starmap(Event, map(_envelope_of(batch).__add__, rows)))
    seqs, types = list(map(_SEQ, rows)), set(map(_TYPE, rows))
    first = seqs[0]
    whole = _SPECIAL_TYPES.isdisjoint(types) and seqs == list(range(first, first + len(seqs)))
    derive = "lifecycle" in types or "rank" in set(map(_STAGE, rows))
    return Frame(records, first if whole else None, derive, finite)


def validate_event(event: Any) -> None:
    """Check one decoded event (a dict) against the schema; raise FrameError naming what is
    wrong."""
    try:
        msgspec.convert(event, Event)
    except msgspec.ValidationError as exc:
        raise explain_event(event) or FrameError("invalid", str(exc)) from None


def explain_event(event: Any) -> FrameError | None:
    """What is wrong with one decoded event, by relay/wire/rules.py ``explain``, or None."""
    wrong = explain(EVENT_FIELDS, event)
    return None if wrong is None else FrameError(*wrong)


def _refusal(frame: bytes, refused: msgspec.DecodeError) -> FrameError:
    """Why the types refused ``frame`` (``explain_frame_bytes``; finding nothing would be a
    disagreement of the two, the fuzzer's to find)."""
    return explain_frame_bytes(frame) or FrameError("invalid", f"refused by the types alone: "
                                                               f"{refused}")


def explain_frame_bytes(frame: bytes) -> FrameError | None:
    """What the rules find wrong with a frame (size aside), decoded as plain objects with every
    value of a key it repeats (msgspec checks each), or None: then the types take it too."""
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True,
                              object_pairs_hook=pairs_hook)
    except UnicodeDecodeError as exc:
        return FrameError("bad_utf8", str(exc))
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError,
            TypeError) as exc:
        return FrameError("undecodable", f"{type(exc).__name__}: {exc}")
    return explain_frame(obj)


def explain_frame(obj: Any) -> FrameError | None:
    """What is wrong with a decoded frame (a map, an array of maps, a compact batch), or None."""
    if type(obj) is list:
        if not obj:
            return FrameError("empty", "frame holds an empty batch")
        return next(filter(None, map(explain_event, obj)), None)
    if not isinstance(obj, dict):
        return FrameError("not_event", f"frame decodes to {type(obj).__name__}, not a map or "
                                       "array of maps")
    if "events" not in obj:
        return explain_event(obj)
    if type(obj) is Repeated:  # each value of a repeated key, as msgspec checks each
        variants = ({**obj, key: value} for key, value in obj.pairs)
        return next(filter(None, map(explain_frame, variants)), None)
    if obj.keys() != _COMPACT_KEYS:
        missing = _COMPACT_KEYS.difference(obj)
        if missing:
            return FrameError("missing_field", f"compact batch missing {sorted(missing)}")
        unknown = sorted(map(str, set(obj) - _COMPACT_KEYS))
        return FrameError("unknown_field", f"compact batch has unknown {unknown}")
    rows = obj["events"]
    if type(rows) is not list:
        return FrameError("bad_type", f"compact batch events must be an array, got "
                                      f"{type(rows).__name__}")
    if not rows:
        return FrameError("empty", "compact batch holds no events")
    envelope = {name: obj[name] for name in ENVELOPE}
    for row in rows:
        if type(row) is not list or len(row) != len(ROW_FIELDS):
            return FrameError("bad_type", f"compact event must be [{', '.join(ROW_FIELDS)}]")
        wrong = explain_event({**envelope, **dict(zip(ROW_FIELDS, row, strict=True))})
        if wrong is not None:
            return wrong
    return None


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
