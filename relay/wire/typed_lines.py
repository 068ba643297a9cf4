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

from operator import attrgetter
from typing import Any

import msgspec

from relay.wire import schema
from relay.wire.rules import fields_of, remembering
from relay.wire.typed_rules import typed
from sinks.events import ENVELOPE, ENVELOPE_KINDS, ROW_FIELDS, ROW_KINDS

#: Fields a line may leave out and still be an event (a journal written by hand or by another tool),
#: with what they are checked as; the event itself is handed on as written.
OPTIONAL_FIELDS: dict[str, Any] = {"v": schema.SCHEMA_VERSION, "local_rank": 0, "world_size": 1, "host": "",
                                   "step": None, "epoch": None, "stage": None}

_FIELDS = fields_of({**ENVELOPE_KINDS, **ROW_KINDS}, schema.KINDS)
#: One journal line's event, each field checked as it was decoded; a field with an ``accept`` test
#: (the run id's pattern) is tested after, once per value (a pattern costs more per line in msgspec).
Line = msgspec.defstruct(
    "Line", [(f.name, typed(f, schema.MAX_NAME_LEN), *([OPTIONAL_FIELDS[f.name]] if f.name in OPTIONAL_FIELDS else []))
             for f in _FIELDS],
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

