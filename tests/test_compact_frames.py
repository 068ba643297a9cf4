"""The compact batch form (envelope once, one row per event) decodes to exactly the events a batch
of maps would, and is rejected with the same reasons when it breaks the schema."""
from __future__ import annotations

import math
import random
from collections import Counter

import msgpack
import pytest

from relay.wire import encoding, schema
from sinks.events import FIELDS, ROW_FIELDS

ENVELOPE = {"v": 1, "run": "run-1", "rank": 3, "local_rank": 1, "world_size": 4, "host": "node-a"}


def _rows(n: int) -> list[bytes]:
    return [encoding.encode_row(i, 1.5 + i, "metrics", i, 0.25, "train", {"loss": 1.0 / (i + 1), "nested": {"a": [1]}})
            for i in range(n)]


def test_compact_batch_decodes_to_the_same_events_as_maps() -> None:
    events = schema.decode_frame(encoding.compact_frame(encoding.compact_prefix(ENVELOPE), _rows(20)))
    assert [e["seq"] for e in events] == list(range(20))
    assert list(events[0]) == list(FIELDS)  # journal lines keep the field order
    assert schema.decode_frame(encoding.encode_frame(events)) == events


def _frame(**over: object) -> bytes:
    frame = {**ENVELOPE, "events": [[0, 1.0, "metrics", 1, None, "train", {"x": 1}]], **over}
    return msgpack.packb({k: v for k, v in frame.items() if v is not ...})


@pytest.mark.parametrize("over, reason", [
    ({"host": ...}, "missing_field"),
    ({"extra": 1}, "unknown_field"),
    ({"events": []}, "empty"),
    ({"events": {"seq": 0}}, "bad_type"),
    ({"events": [[0, 1.0, "metrics"]]}, "bad_type"),
    ({"events": [["0", 1.0, "metrics", 1, None, "train", {}]]}, "bad_type"),
    ({"events": [[0, 1.0, "nope", 1, None, "train", {}]]}, "bad_event_type"),
    ({"run": "../x"}, "bad_run"),
    ({"v": 9}, "bad_version"),
])
def test_bad_compact_batches_are_rejected_whole(over: dict, reason: str) -> None:
    with pytest.raises(schema.FrameError) as err:
        schema.decode_frame(_frame(**over))
    assert err.value.reason == reason


def test_a_bad_row_after_good_ones_rejects_the_whole_frame() -> None:
    rows = _rows(3) + [encoding.encode_row(3, 1.0, "metrics", -1, None, "train", {})]
    with pytest.raises(schema.FrameError) as err:
        schema.decode_frame(encoding.compact_frame(encoding.compact_prefix(ENVELOPE), rows))
    assert err.value.reason == "bad_type"
    deep = _rows(2) + [encoding.encode_row(2, 1.0, "metrics", 1, None, "train", {"k" * 300: 1})]
    with pytest.raises(schema.FrameError) as err:
        schema.decode_frame(encoding.compact_frame(encoding.compact_prefix(ENVELOPE), deep))
    assert err.value.reason == "name_too_long"


GOOD_COLUMNS = ([0], [1.5, 2], ["metrics", "params", "lifecycle"], [None, 0, 7], [None, 0.5, 1], [None, "train", ""],
                [{"loss": 1.0, "ok": True, "note": None, "name": "x"}, {}])
BAD_COLUMNS = ([-1, "0", 1.5, True, None], ["x", None, True], ["nope", 3, b"metrics", None],
               [-1, 1.5, True, "1"], ["e", True, [1]], ["s" * 300, 3, b"x"],
               [[], {"k" * 300: 1}, {"a": b"x"}, {b"k": 1}, {"a": msgpack.ExtType(1, b"x")}, 5])
NESTED = [{"a": {"b": [1, {"c": 2}]}}, {"d": [[[[[[[[[[1]]]]]]]]]]}, {"a": {"k" * 300: 1}}]


def _random_rows(rng: random.Random) -> list:
    rows = []
    for seq in range(rng.randint(1, 12)):
        row = [rng.choice(column) for column in GOOD_COLUMNS]
        row[0] = seq
        if rng.random() < 0.1:
            column = rng.randrange(len(ROW))
            row[column] = rng.choice(BAD_COLUMNS[column])
        if rng.random() < 0.05:
            row[6] = rng.choice(NESTED)
        if rng.random() < 0.03:
            row = rng.choice([row[:6], tuple(row), "row", 7, {"seq": seq}])
        rows.append(row)
    return msgpack.unpackb(msgpack.packb(rows, use_bin_type=True), raw=False, strict_map_key=True)


ROW = ROW_FIELDS


def test_first_seq_marks_only_gapless_plain_runs() -> None:
    def first_seq(rows: list[tuple]) -> int | None:
        frame = encoding.compact_frame(encoding.compact_prefix(ENVELOPE), [encoding.encode_row(*r) for r in rows])
        return schema.decode(frame).first_seq

    row = (0, 1.0, "metrics", 1, None, "train", {"x": 1})
    assert first_seq([(s, *row[1:]) for s in (5, 6, 7)]) == 5
    for kind, stage, derive in (("metrics", "rank", True), ("metrics", "ranks", False), ("metrics", None, False),
                                ("lifecycle", None, True)):  # the cluster hears of each rank figure and lifecycle
        rows = [(5, *row[1:]), (6, 1.0, kind, 1, None, stage, {"step_time": 0.1})]
        frame = encoding.compact_frame(encoding.compact_prefix(ENVELOPE), [encoding.encode_row(*r) for r in rows])
        assert schema.decode(frame).derive is derive
    assert first_seq([(s, *row[1:]) for s in (5, 7, 8)]) is None  # a gap
    assert first_seq([(s, *row[1:]) for s in (6, 5)]) is None  # out of order
    assert first_seq([(0, 1.0, "hello", None, None, None, {}), (1, *row[1:])]) is None  # hello: acted on one by one
    assert first_seq([(0, *row[1:]), (1, 1.0, "stats", None, None, None, {"dropped": 1})]) is None
    assert schema.decode(encoding.encode_frame([{**ENVELOPE, "seq": 0, "ts": 1.0, "type": "metrics", "step": 1,
                                               "epoch": None, "stage": None, "data": {}}])).first_seq is None


#: Envelope values the types must refuse, or take exactly as the explainer does.
ODD_ENVELOPES = [{"run": "../x"}, {"run": "r" * 129}, {"v": True}, {"v": 1.0}, {"rank": 2 ** 24}, {"rank": -1},
                 {"world_size": 0}, {"host": "h" * 256}, {"host": "\U0001F600" * 256}, {"host": "\U0001F600" * 257},
                 {"local_rank": 2 ** 64 - 1}, {"run": "ok-2"}, {"host": b"bytes"}]
ODD_VALUES = [2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, -(2 ** 63), math.nan, math.inf, -0.0, 1e300, True, None, "",
              b"x", msgpack.ExtType(5, b"\x00" * 4), msgpack.Timestamp(1, 0), [1], {"a": 1}, "\U0001F600" * 300]


def _random_frame(rng: random.Random) -> bytes:
    """A compact batch, mostly valid, bent at random: an envelope value, a row cell, a duplicated or a
    trailing key, or bytes after the frame."""
    envelope = {**ENVELOPE, **(rng.choice(ODD_ENVELOPES) if rng.random() < 0.2 else {})}
    rows = _random_rows(rng)
    for row in rows:
        if type(row) is list and len(row) == len(ROW) and rng.random() < 0.1:
            row[rng.randrange(1, len(ROW))] = rng.choice(ODD_VALUES)
        if type(row) is list and len(row) == len(ROW) and type(row[6]) is dict and rng.random() < 0.1:
            row[6] = {**row[6], "odd": rng.choice(ODD_VALUES)}
    pairs = [*envelope.items(), ("events", rows)]
    if rng.random() < 0.05:
        # a key twice, before or after
        twice = rng.choice([rng.choice(pairs[:-1]), ("run", "../x"), ("seq", 1)])
        pairs.insert(rng.randrange(len(pairs) + 1), twice)
    single = rng.random() < 0.1  # floats as float32 (where each fits)
    frame = bytes((0x80 | len(pairs),)) + b"".join(msgpack.packb(k) + _pack(v, single) for k, v in pairs)
    return frame + (b"\x00" if rng.random() < 0.02 else b"")


def _pack(value: object, single: bool) -> bytes:
    try:
        return msgpack.packb(value, use_single_float=single)
    except OverflowError:
        return msgpack.packb(value)


def test_the_types_and_the_explainer_agree_on_every_frame() -> None:
    """The types decide (schema.decode) and the explainer says why (schema.explain_frame_bytes): on
    compact batches bent every way, they give the same verdict and the same reason; what the types
    take are the events the frame holds (values and their types), and ``finite`` only where no float
    is a NaN or an infinity (ingest then writes their lines without looking for one)."""
    rng = random.Random(2812)
    outcomes: Counter = Counter()
    for _ in range(3000):
        frame = _random_frame(rng)
        explained = schema.explain_frame_bytes(frame)
        try:
            decoded: schema.Frame | None = schema.decode(frame)
        except schema.FrameError as exc:
            assert explained is not None and str(exc) == str(explained), frame
            outcomes["refused"] += 1
            continue
        assert explained is None and decoded is not None, (frame, explained)
        plain = msgpack.unpackb(frame, raw=False)
        envelope = {k: plain[k] for k in ENVELOPE}
        held = [{**envelope, **dict(zip(ROW, row, strict=True))} for row in plain["events"]]
        assert _same(decoded.events, held), frame
        floats = _floats([e["data"] for e in decoded.events])
        assert decoded.finite == all(map(math.isfinite, floats)), frame
        nested = any(type(v) in (dict, list) for e in decoded.events for v in e["data"].values())
        outcomes["nested" if nested else "finite" if decoded.finite else "not finite"] += 1
    assert min(outcomes.values()) > 10 and len(outcomes) == 4, outcomes  # every kind was exercised


def _floats(value: object) -> list[float]:
    """Every float in ``value``, however deep."""
    if type(value) is float:
        return [value]
    items = value.values() if type(value) is dict else value if type(value) is list else ()
    return [f for item in items for f in _floats(item)]


def _same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down (1.0 is not 1)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b or (a != a and b != b)
