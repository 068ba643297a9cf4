"""The event model has one home, sinks/events.py: every list of fields derives from it, so a new
field is one edit there, and the wire, which must know a valid value of every field, refuses to load
until it has the new field's rule (it never passes a field on unchecked)."""
from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT

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
    """No module of the project spells the field list but sinks/events.py; the one other list is the
    wire's own (which fields it has a rule for), checked against the model when it loads."""
    lists = []
    for path in sorted(p for package in ("relay", "sinks", "trainer") for p in (ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in FIELDS]
                if len(names) > 3:
                    lists.append((path.relative_to(ROOT).as_posix(), tuple(names)))
    assert sorted(lists) == sorted([("relay/wire/schema.py", FIELDS), ("sinks/events.py", ENVELOPE),
                                    ("sinks/events.py", ROW_FIELDS)])


NEW_FIELD = """
import inspect, sys
import sinks.events as model
source = inspect.getsource(model)
edit = 'ROW_FIELDS: tuple[str, ...] = ("seq", '
assert edit in source
exec(compile(source.replace(edit, edit + '"note", '), model.__file__, "exec"), vars(model))
print(model.FIELDS)
try:
    import relay.wire.lines
except ImportError as exc:
    print(exc)
    sys.exit(3)
"""


def test_a_new_field_is_one_edit_and_the_wire_wants_its_rule() -> None:
    proc = subprocess.run([sys.executable, "-c", NEW_FIELD], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 3, proc.stderr
    fields, refusal = proc.stdout.splitlines()
    assert fields == repr(ENVELOPE + ("seq", "note") + ROW_FIELDS[1:])
    assert "relay/wire/schema.py has no validation rule for the event fields ['note']" in refusal
