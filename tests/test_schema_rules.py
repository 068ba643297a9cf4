"""The wire's one validation engine is made from one rule table (relay/wire/schema.py KINDS) and the
event model's fields (sinks/events.py): msgspec types decide, one plain-Python explainer says why.
A field added to the model is checked with no edit to schema.py (tests/test_event_model.py makes
that edit); here each rule of the table, at its edges, gets the same verdict from the types and the
explainer, on a dict and on the frame that carries it."""
from __future__ import annotations

import math
from itertools import chain

import msgpack
import msgspec
import pytest

from relay.wire import rules, schema
from sinks.events import ENVELOPE_KINDS, FIELDS, ROW_KINDS

GOOD = {"v": 1, "run": "r-1", "rank": 0, "local_rank": 0, "world_size": 2, "host": "h", "seq": 0,
        "ts": 1.5, "type": "metrics", "step": 3, "epoch": 0.5, "stage": "train", "data": {}}


def _nest(value: object, depth: int, as_list: bool) -> object:
    for _ in range(depth):
        value = [value] if as_list else {"k": value}
    return value


#: Values that are not any rule's edge in particular: types, specials, lengths, nesting.
ODD = [None, True, False, 0, 1, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 0.0, -0.0, 0.5, 1e300,
       math.nan, math.inf, -math.inf, "", "x", "x" * 128, "x" * 129, "x" * 256, "x" * 257,
       "\U0001F600" * 256, "a b", "../x", ".x", "metrics", "hello", "nope", b"x", [], [1], {}, {"k": 1},
       {1: 1}, {"k" * 257: 1}, {"k": b"x"},
       {"k": 2**64 - 1}, {"k": -(2**63)}, {"k": 2**70}, {"k": math.nan}, {"k": [1, {"a": None}]},
       *(_nest(1, depth, as_list) for depth in (6, 7, 8) for as_list in (False, True)),
       *({"k": _nest(value, 7, False)} for value in ([], {}, 1))]


def _edges(rule: rules.Rule) -> list[object]:
    """The values at the edges of ``rule``: each bound, one step inside and outside it."""
    out: list[object] = []
    for bound in (rule.low, rule.high):
        if bound is not None:
            out += [bound, int(bound), int(bound) - 1, int(bound) + 1, float(bound), bound - 0.5,
                    bound + 0.5]
    return out + sorted(rule.among or ())


def _verdicts(event: dict) -> tuple[bool, schema.FrameError | None]:
    """Whether the types take ``event``, and what the explainer finds wrong with it."""
    try:
        msgspec.convert(event, schema.Event)
        taken = True
    except msgspec.ValidationError:
        taken = False
    return taken, schema.explain_event(event)


def test_the_types_and_the_explainer_agree_on_every_rule_at_its_edges() -> None:
    outcomes = {"taken": 0, "refused": 0}
    for field in schema.EVENT_FIELDS:
        for value in ODD + _edges(field.rule):
            event = {**GOOD, field.name: value}
            taken, wrong = _verdicts(event)
            assert taken == (wrong is None), (field.name, value, wrong)
            outcomes["taken" if taken else "refused"] += 1
            try:
                frame = msgpack.packb(event)
            except (OverflowError, TypeError):
                continue  # no frame can carry it
            try:
                schema.decode(frame)
                decoded = None
            except schema.FrameError as exc:
                decoded = exc
            assert (decoded is None) == taken, (field.name, value, decoded)
            if decoded is not None and decoded.reason != "undecodable":  # (msgpack refuses a key 1)
                assert wrong is not None and str(decoded) == str(wrong)
    assert min(outcomes.values()) > 100, outcomes


def test_the_wire_checks_the_models_fields_in_its_order() -> None:
    assert tuple(field.name for field in schema.EVENT_FIELDS) == FIELDS
    assert schema.Event.__struct_fields__ == FIELDS  # the events a frame becomes keep the order


def test_a_kind_the_table_lacks_is_refused_at_import_with_what_to_do() -> None:
    with pytest.raises(ImportError, match=r"'tokens' has kind 'tally'.*add its kind there"):
        rules.fields_of({**ENVELOPE_KINDS, **ROW_KINDS, "tokens": "tally"}, schema.KINDS)
    with pytest.raises(ImportError, match="' | None'"):
        rules.fields_of({**ENVELOPE_KINDS, **ROW_KINDS, "tokens": "count | nil"}, schema.KINDS)


@pytest.mark.parametrize("field, value, reason, said", [
    ("seq", -1, "bad_type", "seq must be an int in [0, 9223372036854775807], got -1"),
    ("ts", float("nan"), "bad_value", "ts must be unix seconds (a number) in [0, 253402300799], got nan"),
    ("stage", "s" * 300, "bad_type", "stage must be a string of at most 256 chars or nil, got 'ssss"),
    ("run", ["x"], "bad_run", "run must be a run id matching"),
    ("v", 2, "bad_version", "v must be schema version 1 (this relay's), got 2"),
])
def test_a_refusal_names_the_field_its_rule_and_the_value(field: str, value: object, reason: str, said: str) -> None:
    with pytest.raises(schema.FrameError) as err:
        schema.validate_event({**GOOD, field: value})
    assert err.value.reason == reason and err.value.detail.startswith(said)


def test_a_repeated_key_is_judged_by_each_of_its_values() -> None:
    """msgspec checks every value of a key a map repeats (the last one counts): so does the
    explainer."""
    def frame(*pairs: tuple[str, object]) -> bytes:
        return bytes((0x80 | len(pairs),)) + b"".join(map(msgpack.packb, chain.from_iterable(pairs)))

    items = [(k, v) for k, v in GOOD.items() if k != "seq"]
    for first, last, reason in ((-1, 5, "bad_type"), (5, -1, "bad_type"), (4, 5, None)):
        blob = frame(*items, ("seq", first), ("seq", last))
        explained = schema.explain_frame_bytes(blob)
        assert (explained and explained.reason) == reason
        if reason is None:
            assert schema.decode_frame(blob)[0]["seq"] == last
        else:
            with pytest.raises(schema.FrameError, match=reason):
                schema.decode(blob)
