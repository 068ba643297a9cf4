"""The compact batch form (envelope once, one row per event) decodes to exactly the events a batch
of maps would, and is rejected with the same reasons when it breaks the schema."""
from __future__ import annotations

import math
import random

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


def test_column_checks_accept_exactly_what_the_row_checks_accept() -> None:
    """The relay trusts the column pass; a frame it lets through that a row check would refuse (or a
    plain valid frame it sends down the slow path) is a bug this finds."""
    rng = random.Random(1234)
    outcomes = {"accepted": 0, "rejected": 0, "nested": 0}
    for _ in range(3000):
        rows = _random_rows(rng)
        try:
            expected = schema._expand_checked(rows, tuple(ENVELOPE.values()))
        except schema.FrameError:
            expected = None
        fast = schema._columns_ok(rows)
        nested = expected is not None and any(type(v) in (dict, list) for e in expected for v in e["data"].values())
        if expected is None:
            assert fast is None, rows
            outcomes["rejected"] += 1
        elif nested:
            assert fast is None, rows  # nested data is checked row by row
            outcomes["nested"] += 1
        else:
            assert fast is not None, rows
            assert schema.decode(encoding.compact_frame(encoding.compact_prefix(ENVELOPE),
                                                      [msgpack.packb(r) for r in rows])).events == expected
            outcomes["accepted"] += 1
    assert min(outcomes.values()) > 50, outcomes  # every kind was exercised


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


#: Envelope values the typed path must refuse, or take exactly as the rules do.
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
        pairs.append(rng.choice(pairs[:-1]) if rng.random() < 0.5 else ("run", "../x"))  # a key twice
    single = rng.random() < 0.1  # floats as float32 (where each fits)
    frame = bytes((0x80 | len(pairs),)) + b"".join(msgpack.packb(k) + _pack(v, single) for k, v in pairs)
    return frame + (b"\x00" if rng.random() < 0.02 else b"")


def _pack(value: object, single: bool) -> bytes:
    try:
        return msgpack.packb(value, use_single_float=single)
    except OverflowError:
        return msgpack.packb(value)


def test_the_typed_path_takes_only_what_the_rules_take_as_the_same_values() -> None:
    """A compact batch of flat data is decoded and checked in C (schema._typed_batch); it must take
    only what the rules take, as the same events (values and their types), first seq and derive, and
    no NaN or infinity (``finite``: ingest then writes their lines without looking for one); what it
    leaves, the rules judge."""
    rng = random.Random(2812)
    outcomes = {"typed": 0, "rules took": 0, "refused": 0}
    for _ in range(3000):
        frame = _random_frame(rng)
        typed = schema._typed_batch(frame)
        saved, schema._typed_batch = schema._typed_batch, lambda frame: None  # the rules alone
        try:
            expected: schema.Frame | None = schema.decode(frame)
        except schema.FrameError:
            expected = None
        finally:
            schema._typed_batch = saved
        if typed is None:
            outcomes["refused" if expected is None else "rules took"] += 1
            continue
        outcomes["typed"] += 1
        assert expected is not None, frame
        assert typed[1:] == expected[1:] and _same(typed.events, expected.events), frame
        assert typed.finite and not expected.finite  # its lines need no look for a NaN: it has none
        assert all(math.isfinite(v) for e in typed.events for v in e["data"].values() if type(v) is float), frame
    assert min(outcomes.values()) > 50, outcomes  # every kind was exercised


def _same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down (1.0 is not 1)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b or (a != a and b != b)
