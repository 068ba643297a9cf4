"""Journal lines decoded and checked in C: msgspec turns each line into a typed record (``Line``)
under the rules ``relay.wire.lines.parse_event`` applies, so the common line costs one C call
instead of an orjson parse and the Python checks after it (the consuming relays and the forward
sink read every line of what they carry; this is most of what they cost).

It is a fast path, never the judge: what it refuses is not necessarily wrong (nested data, an
integer past 64 bits, a duplicated key it met first with a bad value, a run id it has not checked
yet), and the caller asks ``parse_event`` about those lines (``relay.wire.lines.ChunkCheck``). What
it takes, ``parse_event`` takes too, as the same values: tests/test_typed_lines.py holds the two
together on randomized lines, broken every way tests/test_chunk_check.py knows.

The record is derived from the event model and the wire's rule table (each field's kind,
sinks/events.py; each kind's rule, relay/wire/schema.py ``KINDS``), as relay/wire/rules.py derives
the wire's checks, so a new field or kind needs no edit here; a rule msgspec cannot say (checks
inside a value other than a map's) is an ImportError naming it.
"""
from __future__ import annotations

import math
from operator import attrgetter
from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta

from relay.wire import schema
from relay.wire.rules import Rule, fields_of, remembering
from sinks.events import ENVELOPE, ENVELOPE_KINDS, ROW_FIELDS, ROW_KINDS

#: Fields a line may leave out and still be an event (a journal written by hand or by another tool),
#: with what they are checked as; the event itself is handed on as written.
OPTIONAL_FIELDS: dict[str, Any] = {"v": schema.SCHEMA_VERSION, "local_rank": 0, "world_size": 1, "host": "",
                                   "step": None, "epoch": None, "stage": None}

#: orjson reads an integer past 64 bits as a float, msgspec as an int: such a line is parse_event's.
_INT64 = (-(1 << 63), (1 << 63) - 1)
#: A map's values: flat data only; a nested map or list is left to parse_event (as the relay's column
#: check leaves it to its row checks).
_VALUE = Union[Annotated[int, Meta(ge=_INT64[0], le=_INT64[1])], float, str, bool, None]


def _typed(field: str, rule: Rule) -> Any:
    """A kind's rule as a msgspec type: what msgspec takes, the rule takes too (``accept`` aside)."""
    if rule.types == (dict,):  # a map: keys as the map check bounds them, flat values
        return dict[Annotated[str, Meta(max_length=schema.MAX_NAME_LEN)], _VALUE]
    if rule.deep is not None or rule.column is not None:
        raise ImportError(f"relay/wire/typed_lines.py cannot type the field {field!r}: its rule checks inside a "
                          f"{'/'.join(t.__name__ for t in rule.types)}; teach _typed() that check, or leave such "
                          "lines to parse_event")
    if rule.among is not None:
        return Literal[tuple(sorted(rule.among))]
    parts: list[Any] = []
    for kind in rule.types:
        if kind is int:
            low = _INT64[0] if rule.low is None else max(_INT64[0], math.ceil(rule.low))
            high = _INT64[1] if rule.high is None else min(_INT64[1], math.floor(rule.high))
            parts.append(Annotated[int, Meta(ge=low, le=high)])
        elif kind is float:
            parts.append(Annotated[float, Meta(ge=rule.low, le=rule.high)])
        elif kind is str:
            parts.append(Annotated[str, Meta(max_length=rule.max_len)] if rule.max_len is not None else str)
        else:
            raise ImportError(f"relay/wire/typed_lines.py cannot type the field {field!r}: a {kind.__name__}")
    return Union[tuple(parts)]


_FIELDS = fields_of({**ENVELOPE_KINDS, **ROW_KINDS}, schema.KINDS)
#: One journal line's event, each field checked as it was decoded; a field with an ``accept`` test
#: (the run id's pattern) is tested after, once per value (a pattern costs more per line in msgspec).
Line = msgspec.defstruct(
    "Line", [(f.name, Optional[_typed(f.name, f.rule)] if f.nullable else _typed(f.name, f.rule),
              *([OPTIONAL_FIELDS[f.name]] if f.name in OPTIONAL_FIELDS else [])) for f in _FIELDS],
    kw_only=True, forbid_unknown_fields=True, gc=False, module=__name__)
_ACCEPT = [(attrgetter(f.name), *remembering(f.rule.accept)) for f in _FIELDS if f.rule.accept is not None]

#: (v, run, rank, local_rank, world_size, host) of a Line, in one C call.
envelope_of = attrgetter(*ENVELOPE)
#: (seq, ts, type, step, epoch, stage, data) of a Line.
row_of = attrgetter(*ROW_FIELDS)
#: (run, rank, seq): what dedupe needs.
key_of = attrgetter("run", "rank", "seq")
run_of = attrgetter("run")

_decode = msgspec.json.Decoder(Line).decode


def decode(lines: list[bytes]) -> list[Any]:
    """Each line as a Line, or None where the typed rules refuse it (parse_event then decides)."""
    try:
        items: list[Any] = [_decode(line) for line in lines]
    except msgspec.DecodeError:  # (a ValidationError too) some line is not one: line by line
        items = [_one(line) for line in lines]
    for value_of, passed, accept in _ACCEPT:
        values = set(map(value_of, filter(None, items)))
        if values <= passed:
            continue
        bad = {value for value in values - passed if not accept(value)}
        if bad:
            items = [None if item is None or value_of(item) in bad else item for item in items]
    return items


def _one(line: bytes) -> Any:
    try:
        return _decode(line)
    except msgspec.DecodeError:
        return None

