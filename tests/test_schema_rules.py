"""The wire's checks are derived from one rule table (relay/wire/schema.py KINDS) and the event
model's fields (sinks/events.py); a field added to the model is checked on every path with no edit
to schema.py (tests/test_event_model.py makes that edit)."""
from __future__ import annotations

import pytest

from relay.wire import rules, schema
from sinks.events import ENVELOPE_KINDS, FIELDS, ROW_KINDS


def test_the_wire_checks_the_models_fields_in_its_order() -> None:
    assert schema.RULES.fields == FIELDS
    assert list(schema.RULES.events_of_rows([list(range(len(ROW_KINDS)))], *range(len(ENVELOPE_KINDS)))[0]) == \
        list(FIELDS)


def test_a_kind_the_table_lacks_is_refused_at_import_with_what_to_do() -> None:
    with pytest.raises(ImportError, match=r"'tokens' has kind 'tally'.*add its kind there"):
        rules.Rules(ENVELOPE_KINDS, {**ROW_KINDS, "tokens": "tally"}, schema.KINDS, schema.FrameError)
    with pytest.raises(ImportError, match="' | None'"):
        rules.Rules(ENVELOPE_KINDS, {**ROW_KINDS, "tokens": "count | nil"}, schema.KINDS, schema.FrameError)


@pytest.mark.parametrize("field, value, reason, said", [
    ("seq", -1, "bad_type", "seq must be an int in [0, 9223372036854775807], got -1"),
    ("ts", float("nan"), "bad_value", "ts must be unix seconds (a number) in [0, 253402300799], got nan"),
    ("stage", "s" * 300, "bad_type", "stage must be a string of at most 256 chars or nil, got 'ssss"),
    ("run", ["x"], "bad_run", "run must be a run id matching"),
    ("v", 2, "bad_version", "v must be schema version 1 (this relay's), got 2"),
])
def test_a_refusal_names_the_field_its_rule_and_the_value(field: str, value: object, reason: str, said: str) -> None:
    event = {"v": 1, "run": "r-1", "rank": 0, "local_rank": 0, "world_size": 2, "host": "h", "seq": 0, "ts": 1.5,
             "type": "metrics", "step": 3, "epoch": 0.5, "stage": "train", "data": {}, field: value}
    with pytest.raises(schema.FrameError) as err:
        schema.validate_event(event)
    assert err.value.reason == reason and err.value.detail.startswith(said)
