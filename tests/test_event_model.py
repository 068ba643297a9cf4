"""The event model has one home, sinks/events.py: every list of fields derives from it, so a new
field is one edit there (its name and its kind of value), and the wire checks it by its kind's rule
with no edit of its own (it never passes a field on unchecked)."""
from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT, parse_python
from relay.wire import encoding, schema
from sinks.events import ENVELOPE, FIELDS, ROW_FIELDS


def test_fields_are_the_envelope_then_the_row() -> None:
    assert FIELDS == ENVELOPE + ROW_FIELDS
    assert not set(ENVELOPE) & set(ROW_FIELDS)


def test_a_compact_batch_expands_to_the_models_fields_in_order() -> None:
    envelope = {"v": schema.SCHEMA_VERSION, "run": "r", "rank": 1, "local_rank": 1, "world_size": 2, "host": "h"}
    rows = [encoding.encode_row(seq, 1.0, "metrics", seq, None, "train", {"loss": 0.5}) for seq in range(3)]
    for frame in (encoding.compact_frame(encoding.compact_prefix(envelope), rows),  # the column path
                  encoding.compact_frame(encoding.compact_prefix(envelope), rows[:1] + [encoding.encode_row(9, 1.0, "x",
                                                                                        None, None, None, {})])):
        try:
            events = schema.decode_frame(frame)
        except schema.FrameError as exc:  # the row-by-row path builds the events it checks the same way
            assert exc.reason == "bad_event_type"
            continue
        assert [list(event) for event in events] == [list(FIELDS)] * 3
        assert [event["seq"] for event in events] == [0, 1, 2]


def test_the_fields_are_listed_in_the_model_alone() -> None:
    """No module of the project spells the field list: sinks/events.py names each field once, with
    its kind of value, and the wire derives its checks from that."""
    lists = []
    for path in sorted(p for package in ("relay", "sinks", "trainer") for p in (ROOT / package).rglob("*.py")):
        for node in ast.walk(parse_python(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in FIELDS]
                if len(names) > 3:
                    lists.append((path.relative_to(ROOT).as_posix(), tuple(names)))
    assert lists == []


#: One edit to sinks/events.py, a field ``tokens`` (a count or nil) at the end of the row (its kind and its
#: type in Event), made to
#: the model's source before the wire is imported; then what the relay makes of frames with it.
NEW_FIELD = """
import inspect
import sinks.events as model
source = inspect.getsource(model)
edit = '"data": "map"}'
assert source.count(edit) == 1
typed = "    data: dict[str, Any]\\n"
assert source.count(typed) == 1
source = source.replace(edit, '"data": "map", "tokens": "count | None"}').replace(typed, typed + "    tokens: int | None\\n")
exec(compile(source, model.__file__, "exec"), vars(model))
print(model.FIELDS)
from relay.wire import encoding, schema

envelope = {"v": 1, "run": "r-1", "rank": 0, "local_rank": 0, "world_size": 2, "host": "h"}
def compact(*tokens, data={"loss": 1.0}):
    rows = [encoding.encode_row(seq, 1.5, "metrics", seq, None, "train", data, t) for seq, t in enumerate(tokens)]
    return encoding.compact_frame(encoding.compact_prefix(envelope), rows)
def outcome(frame):
    try:
        return [e["tokens"] for e in schema.decode(frame).events]
    except schema.FrameError as exc:
        return exc.reason + (" tokens" if "tokens" in exc.detail else "")
event = {**envelope, "seq": 0, "ts": 1.5, "type": "metrics", "step": 3, "epoch": None, "stage": None, "data": {}}
print(outcome(compact(5, None, 7)), outcome(compact(5, -1, 7)), outcome(compact(5, 2 ** 63, 7)),
      outcome(compact(5, "x", 7)))  # the column path
print(outcome(compact(1, -3, data={"a": {"b": 1}})))  # the row path (nested data)
print(outcome(encoding.encode_frame([{**event, "tokens": 4}, {**event, "seq": 1, "tokens": True}])),
      outcome(encoding.encode_frame([event])))  # one event at a time; not optional on the wire
"""


def test_a_new_field_is_one_edit_and_the_wire_checks_it_on_every_path() -> None:
    proc = subprocess.run([sys.executable, "-c", NEW_FIELD], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        repr(FIELDS + ("tokens",)),
        "[5, None, 7] bad_type tokens bad_value tokens bad_type tokens",
        "bad_type tokens",
        "bad_type tokens missing_field tokens",
    ]


def test_a_field_given_a_kind_but_no_type_in_event_stops_the_import() -> None:
    """Event (the TypedDict sinks are typed with) cannot fall behind the fields the wire checks."""
    kind_only = NEW_FIELD.split("exec(")[0].split(".replace(typed")[0]  # the kind given, Event left as it is
    half_edit = kind_only + '\nexec(compile(source, model.__file__, "exec"), vars(model))\n'
    proc = subprocess.run([sys.executable, "-c", half_edit], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and "ImportError: sinks/events.py: Event lists" in proc.stderr, proc.stderr
    assert "give a new field its kind and its type in Event" in proc.stderr
