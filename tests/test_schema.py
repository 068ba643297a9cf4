"""The wire format's validation: every rule rejects with its reason, and valid odd values pass."""
from __future__ import annotations

import math

import msgpack
import pytest

from relay.journal.dedupe import RankState
from relay.wire import encoding, schema
from sinks.events import from_json_metrics, json_safe


def event(**over) -> dict:
    ev = {"v": 1, "run": "r-1", "rank": 0, "local_rank": 0, "world_size": 2, "host": "h", "seq": 0,
          "ts": 1.5, "type": "metrics", "step": 3, "epoch": 0.5, "stage": "train", "data": {"loss": 1.0}}
    ev.update(over)
    return ev


@pytest.mark.parametrize("over, reason", [
    ({"v": 2}, "bad_version"),
    ({"v": True}, "bad_version"),
    ({"run": ""}, "bad_run"),
    ({"run": "a" * 200}, "bad_run"),
    ({"run": ["not", "hashable"]}, "bad_run"),
    ({"rank": True}, "bad_type"),
    ({"rank": -1}, "bad_type"),
    ({"world_size": 0}, "bad_type"),
    ({"seq": 1.0}, "bad_type"),
    ({"ts": "now"}, "bad_type"),
    ({"type": "nope"}, "bad_event_type"),
    ({"type": [1]}, "bad_event_type"),
    ({"host": "h" * 300}, "bad_type"),
    ({"step": -2}, "bad_type"),
    ({"epoch": "1"}, "bad_type"),
    ({"stage": 5}, "bad_type"),
    ({"data": [1, 2]}, "bad_type"),
    ({"data": {"k" * 257: 1}}, "name_too_long"),
    ({"data": {"b": b"bytes"}}, "bad_type"),
    ({"data": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}}, "too_deep"),
    ({"data": {"l": [[[[[[[[[1]]]]]]]]]}}, "too_deep"),
])
def test_rejections_name_their_reason(over, reason):
    with pytest.raises(schema.FrameError) as err:
        schema.decode_frame(msgpack.packb(event(**over), use_bin_type=True))
    assert err.value.reason == reason


def test_missing_and_unknown_fields():
    ev = event()
    del ev["seq"]
    with pytest.raises(schema.FrameError, match="missing_field"):
        schema.validate_event(ev)
    with pytest.raises(schema.FrameError, match="unknown_field"):
        schema.validate_event(event(extra=1))


def test_valid_edge_values_pass_and_round_trip():
    odd = event(step=None, epoch=None, stage=None, data={"nan": math.nan, "inf": -math.inf, "nested": {"l": [1, "x", None]},
                                                         "flag": True, "ünïcode": "✓"})
    batch = schema.decode_frame(encoding.encode_frame([odd, event(seq=1)]))
    assert len(batch) == 2 and math.isnan(batch[0]["data"]["nan"]) and batch[0]["data"]["ünïcode"] == "✓"


def test_empty_batch_and_garbage():
    with pytest.raises(schema.FrameError, match="empty"):
        schema.decode_frame(msgpack.packb([]))
    with pytest.raises(schema.FrameError, match="undecodable"):
        schema.decode_frame(b"\xc1")


def test_json_safe_round_trip():
    data = {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.0, "e": {"f": math.nan}}
    safe = json_safe(data)
    assert safe == {"a": "NaN", "b": "Infinity", "c": "-Infinity", "d": 1.0, "e": {"f": "NaN"}}
    back = from_json_metrics(safe)
    assert math.isnan(back["a"]) and back["b"] == math.inf and math.isnan(back["e"]["f"])


def test_dedupe_window():
    st = RankState()
    assert [st.take(s) for s in (0, 1, 3, 3, 2, 1)] == [True, True, True, False, True, False]
    assert st.floor == 4 and not st.above
    st.take(10)
    st.skip_to(8)  # the client dropped 4..7 (counted): the floor moves past the gap
    assert st.floor == 8 and st.above == {10}
    assert st.take(8) and st.take(9) and st.floor == 11
