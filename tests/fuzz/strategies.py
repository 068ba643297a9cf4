"""Hypothesis strategies for what reaches the relay from outside: wire frames and journal files.

Frames are mostly valid-looking (compact batches exactly as relay/client/publisher.py's Publisher builds
them, batches of maps, single maps), so that validation passes and the code behind it (journal
encoding, dedupe, acks, the journal readers) sees extreme but well-formed values; a minority
break one field, and the rest are mutated, truncated or random bytes for the decoder itself.
Every strategy returns bytes, so a failing input is one file in the corpus.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import msgpack
import orjson
from hypothesis import strategies as st

from relay.wire import encoding, schema
from relay.wire.lines import encode_line
from sinks.events import ENVELOPE, EVENT_TYPES, FIELDS, ROW_FIELDS

MAX_UINT64 = 2**64 - 1
MIN_INT64 = -(2**63)

#: Integers at the edges of msgpack's, JSON's, float's and the schema's ranges.
INT_EDGES = (0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 2, MAX_UINT64, MIN_INT64,
             schema.MAX_RANK - 1, schema.MAX_RANK)
FLOAT_EDGES = (math.nan, math.inf, -math.inf, 1e308, -1e308, 1.7976931348623157e308, 5e-324, -0.0, 0.0,
               1e19, -1e19, 2.0**63, 2.0**64, 1e12, -1e12, 253402300800.0)
STR_EDGES = ("", "NaN", "Infinity", "-Infinity", "null", "\x00", "\u2028", "x" * schema.MAX_NAME_LEN,
             "x" * (schema.MAX_NAME_LEN + 1), "é" * (schema.MAX_NAME_LEN + 1), "../x", "a/b", "_relay", ".", "..")
RUN_POOL = ("run-a", "run-b", "r", "A" * 128, "0.1_x-y")
STAGES = ("train", "eval", "rank", "client", "hparams", "additional_metrics")
DATA_KEYS = ("loss", "learning_rate", "event", "dropped", "dropped_upto", "pid", "step_time", "NaN", "")
STATS_KEYS = ("dropped", "dropped_full", "dropped_unacked", "dropped_bad", "dropped_closed", "dropped_error",
              "dropped_upto", "published", "resent")

ints = st.one_of(st.sampled_from(INT_EDGES), st.integers(MIN_INT64, MAX_UINT64))
floats = st.one_of(st.sampled_from(FLOAT_EDGES), st.floats())
huge_strings = st.builds(operator.mul, st.sampled_from(["x", "é", "\u2028", "0", "\U0001f600"]),
                         st.sampled_from([schema.MAX_NAME_LEN + 1, 4096, 70_000, 300_000]))
short_strings = st.one_of(st.sampled_from(STR_EDGES), st.text(max_size=12))
strings = st.one_of(short_strings, short_strings, short_strings, huge_strings)  # huge ones fill frames: one in four
scalars = st.one_of(st.none(), st.booleans(), ints, floats, strings)


def rarely(draw: st.DrawFn, one_in: int) -> bool:
    """True one time in ``one_in``; False is what hypothesis shrinks toward (the smaller draw)."""
    return draw(st.integers(1, one_in)) == one_in


def _nest(value: Any, depth: int, as_list: bool) -> Any:
    """``value`` under ``depth`` levels of maps or lists, to probe the nesting limit from both sides."""
    for _ in range(depth):
        value = [value] if as_list else {"k": value}
    return value


deep = st.builds(_nest, scalars, st.integers(schema.MAX_DEPTH - 2, schema.MAX_DEPTH + 3), st.booleans())
#: Anything msgpack can carry, bin and nesting included: the "wrong nested type" for any field.
wire_values = st.one_of(
    st.recursive(st.one_of(scalars, st.binary(max_size=8)),
                 lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                 max_leaves=10),
    deep,
)
#: What a JSON line can hold (no bin): for journal lines the relay did not write.
json_values = st.recursive(st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=False, allow_infinity=False),
                                     strings),
                           lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                  st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                           max_leaves=10)

data_keys = st.one_of(st.sampled_from(DATA_KEYS), st.text(max_size=10), st.sampled_from(STR_EDGES))
data_values = st.one_of(floats, ints, scalars, wire_values)
run_ids = st.one_of(st.sampled_from(RUN_POOL), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", fullmatch=True))
ranks = st.sampled_from([0, 1, 2, 3, schema.MAX_RANK - 2, schema.MAX_RANK - 1])  # the largest: the relay's own
seqs = st.one_of(st.integers(0, 40), st.sampled_from([2**32, 2**63 - 1, 2**63, 2**64 - 2, MAX_UINT64]))
timestamps = st.one_of(st.floats(1.6e9, 1.8e9), floats, ints)


def _data_for(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    """Payloads shaped like each event type's, since the relay and the readers interpret some of them."""
    if kind == "stats":
        counts = st.one_of(st.integers(-1, 60), ints, floats, strings, st.none())
        return st.dictionaries(st.sampled_from(STATS_KEYS), counts, max_size=len(STATS_KEYS))
    if kind == "lifecycle":
        names = st.one_of(st.sampled_from(["train_begin", "checkpoint", "train_end"]), strings, wire_values)
        return st.fixed_dictionaries({"event": names}, optional={"step": ints, "path": strings})
    if kind == "hello":
        return st.fixed_dictionaries({}, optional={"pid": ints, "address": strings, "max_events": ints,
                                                   "versions": st.dictionaries(data_keys, strings, max_size=3)})
    if kind == "params":
        return st.dictionaries(data_keys, st.one_of(scalars, wire_values), max_size=4)
    return st.dictionaries(data_keys, data_values, max_size=6)


@st.composite
def rows(draw: st.DrawFn, seq: int | None = None) -> list[Any]:
    """One event's row fields ``[seq, ts, type, step, epoch, stage, data]``, all valid."""
    kind = draw(st.sampled_from(sorted(EVENT_TYPES)))
    return [
        draw(seqs) if seq is None else seq,
        draw(timestamps),
        kind,
        draw(st.one_of(st.none(), st.integers(0, 100), st.sampled_from([i for i in INT_EDGES if i >= 0]))),
        draw(st.one_of(st.none(), st.floats(0, 3), floats, ints)),
        draw(st.one_of(st.none(), st.sampled_from(STAGES), st.text(max_size=12), st.just("s" * schema.MAX_NAME_LEN))),
        draw(_data_for(kind)),
    ]


@st.composite
def envelopes(draw: st.DrawFn, run: str | None = None) -> dict[str, Any]:
    """The per-rank fields, all valid."""
    return {
        "v": schema.SCHEMA_VERSION,
        "run": draw(run_ids) if run is None else run,
        "rank": draw(ranks),
        "local_rank": draw(ranks),
        "world_size": draw(st.sampled_from([1, 2, 4, schema.MAX_RANK - 1])),
        "host": draw(st.one_of(st.sampled_from(["node-a", "", "h" * schema.MAX_NAME_LEN]), st.text(max_size=12))),
    }


@st.composite
def breakage(draw: st.DrawFn, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with one of them wrong, missing or extra: the schema's own edges."""
    fields = dict(fields)
    how = draw(st.sampled_from(["replace", "replace", "replace", "drop", "extra"]))
    key = draw(st.sampled_from(sorted(fields)))
    if how == "drop":
        del fields[key]
    elif how == "extra":
        fields[draw(st.one_of(st.sampled_from(["events", "extra", "Seq"]), st.text(max_size=6)))] = draw(scalars)
    else:
        fields[key] = draw(st.one_of(scalars, wire_values))
    return fields


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@st.composite
def compact_frames(draw: st.DrawFn, run: str | None = None) -> bytes:
    """A compact batch as the Publisher sends it: the envelope once, then rows; seqs run on from a
    start (the relay's whole-frame fast path) or are drawn one by one (its per-event path)."""
    envelope = draw(envelopes(run))
    count = draw(st.integers(1, 6))
    if draw(st.booleans()):
        first = min(draw(seqs), MAX_UINT64 - count + 1)
        batch: list[Any] = [draw(rows(first + i)) for i in range(count)]
    else:
        batch = [draw(rows()) for _ in range(count)]
    if rarely(draw, 40):  # control characters take 6 bytes in JSON: a line near or past its bound
        batch[0][6] = {"s": "\x01" * draw(st.sampled_from([(schema.MAX_LINE_BYTES - 400) // 6,
                                                           schema.MAX_LINE_BYTES // 6 + 1, 170_000]))}
    if rarely(draw, 10):  # one frame in ten breaks the schema in the envelope or a row
        at = draw(st.integers(0, count - 1))
        where = draw(st.sampled_from(["envelope", "row", "shape"]))
        if where == "envelope":
            envelope = draw(breakage(envelope))
        elif where == "row":
            batch[at] = list(draw(breakage(dict(enumerate(batch[at])))).values())
        else:
            batch[at] = draw(st.one_of(st.lists(scalars, max_size=8), scalars))
    if envelope.keys() == set(ENVELOPE):
        return encoding.compact_frame(encoding.compact_prefix(envelope),
                                    [encoding.encode_row(*r) if type(r) is list and len(r) == 7 else _pack(r)
                                     for r in batch])
    return _pack({**envelope, "events": batch})


@st.composite
def events(draw: st.DrawFn, broken: bool = True) -> dict[str, Any]:
    """One event map; with ``broken``, one in ten breaks the schema."""
    event = {**draw(envelopes()), **dict(zip(ROW_FIELDS, draw(rows()), strict=True))}
    if broken and rarely(draw, 10):
        event = draw(breakage(event))
    return event


map_batches = st.lists(events(), min_size=1, max_size=5).map(lambda evs: encoding.encode_batch([_pack(e) for e in evs]))
single_maps = events().map(_pack)


@st.composite
def mutated(draw: st.DrawFn, frame: bytes) -> bytes:
    """A frame with a few bytes flipped, cut, inserted or repeated: the decoder's own edges."""
    buf = bytearray(frame)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(buf)))
        how = draw(st.sampled_from(["flip", "cut", "insert", "repeat"]))
        if how == "flip" and at < len(buf):
            buf[at] = draw(st.one_of(st.sampled_from([0x00, 0xC1, 0xCF, 0xD3, 0xDD, 0xDF, 0xFF]), st.integers(0, 255)))
        elif how == "cut":
            del buf[at:]
        elif how == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=9))
        else:
            buf[at:at] = buf[at:at + draw(st.integers(1, 16))]
    return bytes(buf)


well_formed = st.one_of(compact_frames(), compact_frames(), compact_frames(), map_batches, single_maps)
#: Every shape a frame can take, valid-looking ones first (hypothesis shrinks toward the first).
frames = st.one_of(
    well_formed,
    well_formed.flatmap(mutated),
    wire_values.map(_pack),
    st.binary(max_size=64),
)


@st.composite
def many_runs_frames(draw: st.DrawFn) -> list[bytes]:
    """Frames of one event each from many distinct runs (what a relay serving many jobs at once, or
    a peer inventing run ids, sends): the per-run state and files must stay bounded."""
    count = draw(st.sampled_from([3, 300, 1100, 2100]))
    template = draw(compact_frames())
    try:
        event = schema.decode(template).events[0]
    except schema.FrameError:
        event = {"v": 1, "run": "r", "rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "seq": 0,
                 "ts": 1.7e9, "type": "metrics", "step": None, "epoch": None, "stage": None, "data": {}}
    per_frame = draw(st.sampled_from([1, 500]))
    evs = [{**event, "run": f"many-{i}"} for i in range(count)]
    return [encoding.encode_frame(evs[i:i + per_frame]) for i in range(0, count, per_frame)]


PEERS = (b"peer-0", b"peer-1", b"peer-2")


def _compact(envelope: dict[str, Any], batch: list[list[Any]]) -> bytes:
    return encoding.compact_frame(encoding.compact_prefix(envelope), [encoding.encode_row(*r) for r in batch])


@st.composite
def client_streams(draw: st.DrawFn) -> list[list[Any]]:
    """One rank's publisher as the relay sees it: events in seq order, a range of them dropped and
    reported by a stats event (honestly or not), cut into frames, some resent, possibly through
    another connection: ``[peer, frame]`` ops."""
    envelope = draw(envelopes(run=draw(st.sampled_from(RUN_POOL[:2]))))
    count = draw(st.integers(1, 12))
    low = draw(st.integers(0, count))
    high = draw(st.integers(low, count))  # seqs [low, high) were dropped in the client
    batch = []
    for seq in [*range(low), *range(high, count)]:
        row = draw(rows(seq))
        if not rarely(draw, 4):
            row[1] = draw(st.floats(1.6e9, 1.8e9))
        batch.append(row)
    if high > low or rarely(draw, 3):
        upto = draw(st.one_of(st.just(high - 1), st.integers(-1, count + 2), st.sampled_from(INT_EDGES)))
        batch.append([count, 1.7e9, "stats", None, None, "client", {"dropped": high - low, "dropped_upto": upto}])
    frames: list[list[list[Any]]] = []
    while len(batch) > sum(map(len, frames)):
        done = sum(map(len, frames))
        frames.append(batch[done:done + draw(st.integers(1, 4))])
    peer = draw(st.sampled_from(PEERS))
    ops: list[list[Any]] = [[peer, _compact(envelope, f)] for f in frames]
    for _ in range(draw(st.integers(0, 3)) if frames else 0):  # resends, maybe through a new connection
        ops.insert(draw(st.integers(0, len(ops))),
                   [draw(st.sampled_from(PEERS)), _compact(envelope, draw(st.sampled_from(frames)))])
    return ops


@st.composite
def ingest_sessions(draw: st.DrawFn) -> bytes:
    """What several peers send one relay: ``[layout, ops]`` packed, each op a ``[peer, frame]``,
    a ``[peer]`` for its disconnection, or nil for a journal flush. Publishers' streams are
    interleaved, and runs come from a small pool, so peers collide on the same (run, rank, seq) and
    dedupe, stream ownership, drop reports and acks interact."""
    streams: list[list[Any]] = []
    for _ in range(draw(st.integers(1, 6))):
        choice = draw(st.integers(0, 21))
        if choice >= 20:
            streams.append([[draw(st.sampled_from(PEERS))]])
            continue
        if choice < 10:
            streams.append(draw(client_streams()))
        elif choice < 17:
            frame = draw(st.one_of(compact_frames(run=draw(st.sampled_from(RUN_POOL[:2]))), frames))
            streams.append([[draw(st.sampled_from(PEERS)), frame]])
        elif choice < 19:
            streams.append([None])
        else:
            peer = draw(st.sampled_from(PEERS))
            streams.append([[peer, f] for f in draw(many_runs_frames())])
    ops: list[Any] = []
    while any(streams):
        live = [stream for stream in streams if stream]
        ops.append(live[draw(st.integers(0, len(live) - 1))].pop(0))
    layout = draw(st.sampled_from(["dir", "file"]))
    return _pack([layout, ops])


@st.composite
def journal_lines(draw: st.DrawFn) -> bytes:
    """One journal line: as the relay writes it (from a valid event), or a JSON object it did not
    write (a hand edit, another tool), or bytes that are not JSON at all."""
    kind = draw(st.integers(0, 6))
    if kind <= 2:
        return encode_line(draw(events(broken=False)))
    event = draw(events(broken=False))
    if kind == 3:  # the run id names the file replay writes: a foreign one must not escape the directory
        event["run"] = draw(st.one_of(st.sampled_from(STR_EDGES), strings, json_values))
        return orjson.dumps(event, default=str) + b"\n"
    if kind == 4:
        event = {k: v for k, v in event.items() if not rarely(draw, 12)}
        for key in draw(st.lists(st.sampled_from(FIELDS), max_size=2)):
            event[key] = draw(json_values)
        return orjson.dumps(event, default=str) + b"\n"
    if kind == 5:
        return orjson.dumps(draw(json_values), default=str) + b"\n"
    return draw(st.binary(max_size=40)) + b"\n"


#: The most bytes the many-runs lines of one drawn journal take.
MANY_RUNS_BYTES = 8 << 20


@st.composite
def journals(draw: st.DrawFn) -> bytes:
    """A journal file: lines, sometimes from many runs, sometimes with a torn last line."""
    lines = draw(st.lists(journal_lines(), min_size=0, max_size=8))
    if rarely(draw, 20):
        base = draw(events(broken=False))
        runs = draw(st.sampled_from([300, 1100]))
        # At most MANY_RUNS_BYTES of them: 1,100 copies of an event of huge strings made a 1.3 GB journal
        # (23 CPU-s and gigabytes of memory and disk for one example); a huge event still gets a few runs.
        runs = min(runs, max(2, MANY_RUNS_BYTES // len(encode_line(base))))
        lines += [encode_line({**base, "run": f"many-{i}"}) for i in range(runs)]
    blob = b"".join(lines)
    if blob and rarely(draw, 5):
        blob = blob[: draw(st.integers(0, len(blob) - 1))]  # a torn tail, as a crash leaves it
    elif rarely(draw, 10):  # a whole event but for its newline: never acknowledged, so not there
        blob += encode_line(draw(events(broken=False))).rstrip(b"\n")
    elif rarely(draw, 60):  # a crash in one long line: more than a MiB without a newline
        blob += b'{"v":1,"run":"run-a","data":{"s":"' + draw(st.sampled_from([b"\x01", b"x"])) * (3 << 19)
    return blob
