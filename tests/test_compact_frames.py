"""The compact batch form (envelope once, one row per event) decodes to exactly the events a batch
of maps would, and is rejected with the same reasons when it breaks the schema."""
from __future__ import annotations

import msgpack
import pytest

from relay import schema

ENVELOPE = {"v": 1, "run": "run-1", "rank": 3, "local_rank": 1, "world_size": 4, "host": "node-a"}


def _rows(n: int) -> list[bytes]:
    return [schema.encode_row(i, 1.5 + i, "metrics", i, 0.25, "train", {"loss": 1.0 / (i + 1), "nested": {"a": [1]}})
            for i in range(n)]


def test_compact_batch_decodes_to_the_same_events_as_maps() -> None:
    events = schema.decode_frame(schema.compact_frame(schema.compact_prefix(ENVELOPE), _rows(20)))
    assert [e["seq"] for e in events] == list(range(20))
    assert list(events[0]) == list(schema.FIELDS)  # journal lines keep the field order
    assert schema.decode_frame(schema.encode_frame(events)) == events


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
    rows = _rows(3) + [schema.encode_row(3, 1.0, "metrics", -1, None, "train", {})]
    with pytest.raises(schema.FrameError) as err:
        schema.decode_frame(schema.compact_frame(schema.compact_prefix(ENVELOPE), rows))
    assert err.value.reason == "bad_type"
    deep = _rows(2) + [schema.encode_row(2, 1.0, "metrics", 1, None, "train", {"k" * 300: 1})]
    with pytest.raises(schema.FrameError) as err:
        schema.decode_frame(schema.compact_frame(schema.compact_prefix(ENVELOPE), deep))
    assert err.value.reason == "name_too_long"
