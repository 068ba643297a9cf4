"""The compact batch form (envelope once, one row per event) decodes to exactly the events a batch
of maps would, and is rejected with the same reasons when it breaks the schema."""
from __future__ import annotations

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
