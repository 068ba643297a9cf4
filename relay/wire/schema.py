"""The wire format, as the relay reads it: a frame (a map, a batch, a compact batch) decoded and
validated, the relay's acks decoded, and the limits. Putting frames on the wire is
relay/wire/encoding.py; what an event is (its fields, types, the relay's own rank) is the event
model's, sinks/events.py; this module imports it and re-exports nothing.

One module owns the rules so the client, the daemon, replay and every test agree on them.
See docs/protocol.md for the field table and the limits. The validation has two paths that must
agree rule for rule: the column-by-column fast path for compact batches and the row checks that
name what is wrong (tests/test_compact_frames.py holds them together).
"""
from __future__ import annotations

import math
import operator
import re
from itertools import chain
from typing import Any, Callable, NamedTuple

import msgpack

from sinks.events import ENVELOPE, EVENT_TYPES, FIELDS, ROW_FIELDS

SCHEMA_VERSION = 1

#: The fields validate_event has a rule for, in the model's order (sinks/events.py): a field added
#: to the model is refused here until the wire knows what a valid value of it is.
_RULED_FIELDS = ("v", "run", "rank", "local_rank", "world_size", "host",
                 "seq", "ts", "type", "step", "epoch", "stage", "data")
if FIELDS != _RULED_FIELDS:
    raise ImportError(f"relay/wire/schema.py has no validation rule for the event fields "
                      f"{sorted(set(FIELDS) ^ set(_RULED_FIELDS))} (or not in sinks.events.FIELDS order): "
                      "add it to validate_event, _explain and the compact batch checks")

_FIELD_SET = frozenset(FIELDS)
#: A compact batch names the envelope once: these keys, then ``events`` rows of ROW_FIELDS.
_COMPACT_KEYS = frozenset(ENVELOPE + ("events",))

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
    once, then the rows column by column (see _plain_run); only a batch that fails that is
    checked row by row, to find and name what is wrong."""
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
    envelope = _get_envelope(frame)
    checked = _columns_ok(rows)
    if checked is None:
        return Frame(_expand_checked(rows, envelope))
    first_seq, derive = checked
    events = _events_of_rows(rows, *envelope)
    validate_event(events[0])  # the envelope, which every row shares
    return Frame(events, first_seq if first_seq >= 0 else None, derive)


def _rows_to_events() -> Callable[..., list[dict[str, Any]]]:
    """``(rows, *envelope) -> events``: a compact batch's rows as whole events, each a dict of FIELDS
    in order. Built from the model once, as namedtuple builds its class, so the fields are named in
    one place and each event is still one dict display (a dict of a zip per row costs twice as much)."""
    envelope = [f"e{i}" for i in range(len(ENVELOPE))]
    row = [f"r{i}" for i in range(len(ROW_FIELDS))]
    items = ", ".join(f"{name!r}: {var}" for name, var in zip(FIELDS, envelope + row))
    return eval(f"lambda rows, {', '.join(envelope)}: [{{{items}}} for {', '.join(row)} in rows]", {})


_events_of_rows = _rows_to_events()


def _expand_checked(rows: list[Any], envelope: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The row-by-row path of _expand, for batches whose columns did not pass as a whole."""
    events: list[dict[str, Any]] = []
    for row in rows:
        if type(row) is not list or len(row) != len(ROW_FIELDS):
            raise FrameError("bad_type", f"compact event must be [{', '.join(ROW_FIELDS)}]")
        seq, ts, typ, step, epoch, stage, data = row
        event = _events_of_rows((row,), *envelope)[0]
        if not events:
            validate_event(event)
        elif (type(seq) is int and 0 <= seq <= MAX_SEQ and type(ts) in _NUMBERS and 0 <= ts <= MAX_TS
              and type(typ) is str and typ in EVENT_TYPES
              and (step is None or (type(step) is int and 0 <= step <= MAX_SEQ))
              and (epoch is None or (type(epoch) in _NUMBERS and -MAX_EPOCH <= epoch <= MAX_EPOCH))
              and (stage is None or (type(stage) is str and len(stage) <= MAX_NAME_LEN))
              and type(data) is dict):
            _check_map(data, 1)
        else:
            _explain(event)
        events.append(event)
    return events


_NONE = type(None)
_STEP_TYPES = frozenset({int, _NONE})
_EPOCH_TYPES = frozenset({int, float, _NONE})
_STAGE_TYPES = frozenset({str, _NONE})
_SPECIAL_TYPES = frozenset({"hello", "stats"})  # events the relay acts on one by one


def _columns_ok(rows: list[Any]) -> tuple[int, bool] | None:
    """Check a compact batch's rows by column, each rule one pass in C over all rows; the same rules
    as validate_event, except that nested data is left to the row-by-row path.

    Returns None if any rule fails (the caller then finds out which, row by row), else the first
    seq if the seqs run on without a gap and no row is a hello or stats event (else -1), and whether
    a row has stage ``rank`` or type ``lifecycle``.
    """
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {len(ROW_FIELDS)}:
        return None
    seqs, tss, types, steps, epochs, stages, datas = zip(*rows)
    if not (set(map(type, seqs)) == {int} and min(seqs) >= 0 and max(seqs) <= MAX_SEQ
            and set(map(type, tss)) <= _NUMBERS and _in_range(tss, 0, MAX_TS)
            and set(map(type, types)) == {str} and EVENT_TYPES.issuperset(types)
            and set(map(type, steps)) <= _STEP_TYPES and min(filter(None, steps), default=1) > 0
            and max(filter(None, steps), default=0) <= MAX_SEQ
            and set(map(type, epochs)) <= _EPOCH_TYPES
            and _in_range(list(filter(None, epochs)), -MAX_EPOCH, MAX_EPOCH)
            and set(map(type, stages)) <= _STAGE_TYPES
            and max(map(len, filter(None, stages)), default=0) <= MAX_NAME_LEN
            and set(map(type, datas)) == {dict}):
        return None
    if not all(type(key) is str and len(key) <= MAX_NAME_LEN for key in set(chain.from_iterable(datas))):
        return None  # (a set first: rows of one rank mostly repeat the same few keys)
    if not _SCALARS.issuperset(map(type, chain.from_iterable(map(dict.values, datas)))):
        return None
    first = seqs[0]
    if not (_SPECIAL_TYPES.isdisjoint(types) and seqs == tuple(range(first, first + len(seqs)))):
        first = -1
    return first, "rank" in stages or "lifecycle" in types


def rows_pass(rows: list[list[Any]]) -> bool:
    """Whether compact rows (``[seq, ts, type, step, epoch, stage, data]`` lists, none nested in
    data) pass validate_event's rules, checked a column at a time as a relay checks a compact batch.
    False says only that one may not: check those one by one (relay/forward/lines.py does)."""
    return not rows or _columns_ok(rows) is not None


def _in_range(values: Any, low: float, high: float) -> bool:
    """Every one of ``values`` (a column: a tuple or list of numbers) within [low, high], NaN never;
    three passes in C, as min() and max() alone can step over a NaN."""
    if not values:
        return True
    lowest, highest = min(values), max(values)
    return low <= lowest <= highest <= high and all(map(_isfinite, values))


_isfinite = math.isfinite
_get_envelope = operator.itemgetter(*ENVELOPE)
_get_fields = operator.itemgetter(*FIELDS)
_NUMBERS = frozenset({int, float})
_good_runs: set[str] = set()


def _run_ok(run: str) -> bool:
    if RUN_ID_RE.match(run) is None:
        return False
    if len(_good_runs) > 4096:
        _good_runs.clear()
    _good_runs.add(run)
    return True


def validate_event(ev: Any) -> None:
    """Check one decoded event against the schema; raise FrameError naming what is wrong.

    This is the relay's hot path, so the common case is one boolean expression over locals; only
    a failing event pays for finding out which rule it broke.
    """
    if type(ev) is dict and ev.keys() == _FIELD_SET:
        v, run, rank, lrank, ws, host, seq, ts, typ, step, epoch, stage, data = _get_fields(ev)
        if (type(v) is int and v == SCHEMA_VERSION
                and type(run) is str and (run in _good_runs or _run_ok(run))
                and type(rank) is int and type(lrank) is int and type(ws) is int
                and 0 <= rank < MAX_RANK and 0 <= lrank < MAX_RANK and 0 < ws < MAX_RANK
                and type(seq) is int and 0 <= seq <= MAX_SEQ and type(ts) in _NUMBERS and 0 <= ts <= MAX_TS
                and type(typ) is str and typ in EVENT_TYPES
                and type(host) is str and len(host) <= MAX_NAME_LEN
                and (step is None or (type(step) is int and 0 <= step <= MAX_SEQ))
                and (epoch is None or (type(epoch) in _NUMBERS and -MAX_EPOCH <= epoch <= MAX_EPOCH))
                and (stage is None or (type(stage) is str and len(stage) <= MAX_NAME_LEN))
                and type(data) is dict):
            _check_map(data, 1)
            return
    _explain(ev)


def _explain(ev: Any) -> None:
    """The slow path of validate_event: find what is wrong and say it."""
    if type(ev) is not dict:
        raise FrameError("not_event", f"batch element is {type(ev).__name__}, not a map")
    if ev.keys() != _FIELD_SET:
        missing = _FIELD_SET.difference(ev)
        if missing:
            raise FrameError("missing_field", f"missing {sorted(missing)}")
        raise FrameError("unknown_field", f"unknown {sorted(map(str, set(ev) - _FIELD_SET))}")
    if type(ev["v"]) is not int or ev["v"] != SCHEMA_VERSION:
        raise FrameError("bad_version", f"schema version {ev['v']!r}, this relay speaks {SCHEMA_VERSION}")
    run = ev["run"]
    if type(run) is not str or RUN_ID_RE.match(run) is None:
        raise FrameError("bad_run", f"run id {str(run)[:64]!r} must match {RUN_ID_RE.pattern}")
    for key in ("rank", "local_rank", "world_size"):
        val = ev[key]
        if type(val) is not int or not 0 <= val < MAX_RANK:
            raise FrameError("bad_type", f"{key} must be an int in [0, {MAX_RANK}), got {val!r}")
    if ev["world_size"] < 1:
        raise FrameError("bad_type", "world_size must be >= 1")
    seq = ev["seq"]
    if type(seq) is not int or seq < 0:
        raise FrameError("bad_type", f"seq must be a non-negative int, got {seq!r}")
    if seq > MAX_SEQ:
        raise FrameError("bad_value", f"seq {seq} exceeds {MAX_SEQ}")
    ts = ev["ts"]
    if type(ts) is not float and type(ts) is not int:
        raise FrameError("bad_type", f"ts must be a number, got {type(ts).__name__}")
    if not 0 <= ts <= MAX_TS:
        raise FrameError("bad_value", f"ts {ts!r} is not unix seconds in [0, {MAX_TS:.0f}]")
    if type(ev["type"]) is not str or ev["type"] not in EVENT_TYPES:
        raise FrameError("bad_event_type", f"type {str(ev['type'])[:64]!r} is not one of {sorted(EVENT_TYPES)}")
    host = ev["host"]
    if type(host) is not str or len(host) > MAX_NAME_LEN:
        raise FrameError("bad_type", f"host must be a string of at most {MAX_NAME_LEN} chars")
    step = ev["step"]
    if step is not None and (type(step) is not int or step < 0):
        raise FrameError("bad_type", f"step must be a non-negative int or nil, got {step!r}")
    if step is not None and step > MAX_SEQ:
        raise FrameError("bad_value", f"step {step} exceeds {MAX_SEQ}")
    epoch = ev["epoch"]
    if epoch is not None and type(epoch) is not float and type(epoch) is not int:
        raise FrameError("bad_type", f"epoch must be a number or nil, got {type(epoch).__name__}")
    if epoch is not None and not -MAX_EPOCH <= epoch <= MAX_EPOCH:
        raise FrameError("bad_value", f"epoch {epoch!r} is not a finite number within +-{MAX_EPOCH:g}")
    stage = ev["stage"]
    if stage is not None and (type(stage) is not str or len(stage) > MAX_NAME_LEN):
        raise FrameError("bad_type", f"stage must be a string of at most {MAX_NAME_LEN} chars or nil")
    data = ev["data"]
    if type(data) is not dict:
        raise FrameError("bad_type", f"data must be a map, got {type(data).__name__}")
    raise FrameError("invalid", "event fails validation")  # unreachable unless the two paths disagree


_SCALARS = frozenset({float, int, str, bool, type(None)})


def _check_map(obj: dict, depth: int) -> None:
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


def decode_ack(frame: bytes) -> list[tuple[str, int, int]]:
    """Client side of encode_ack; raises FrameError on anything else."""
    try:
        obj = msgpack.unpackb(frame, raw=False)
        return [(str(r), int(k), int(n)) for r, k, n in obj["ack"]]
    except Exception as exc:  # any malformed ack is one counted protocol error for the caller
        raise FrameError("bad_ack", f"{type(exc).__name__}: {exc}") from None
