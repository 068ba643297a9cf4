"""Journal lines decoded and checked in C: msgspec turns each line into a typed record (``Line``)
under the rules ``relay.wire.lines.parse_event`` applies, so the common line costs one C call
instead of an orjson parse and the Python checks after it (the consuming relays and the forward
sink read every line of what they carry; this is most of what they cost).

It is a fast path, never the judge: what it refuses is not necessarily wrong (nested data, an
integer past 64 bits, a duplicated key it met first with a bad value, a run id it has not checked
yet), and the caller asks ``parse_event`` about those lines (``relay.wire.lines.ChunkCheck``). What
it takes, ``parse_event`` takes too, as the same values: tests/test_typed_lines.py holds the two
together on randomized lines, broken every way tests/test_chunk_check.py knows.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Annotated, Literal, Optional, Union

import msgspec
from msgspec import Meta

from relay.wire import schema
from sinks.events import ENVELOPE, EVENT_TYPES, FIELDS, ROW_FIELDS

_Name = Annotated[str, Meta(max_length=schema.MAX_NAME_LEN)]
_Rank = Annotated[int, Meta(ge=0, lt=schema.MAX_RANK)]
_Seq = Annotated[int, Meta(ge=0, le=schema.MAX_SEQ)]
#: orjson reads an integer past 64 bits as a float, msgspec as an int: such a line is parse_event's.
_Int64 = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
_Ts = Union[Annotated[int, Meta(ge=0, le=int(schema.MAX_TS))], Annotated[float, Meta(ge=0, le=schema.MAX_TS)]]
_Epoch = Union[None, Annotated[int, Meta(ge=-int(schema.MAX_EPOCH), le=int(schema.MAX_EPOCH))],
               Annotated[float, Meta(ge=-schema.MAX_EPOCH, le=schema.MAX_EPOCH)]]
#: Flat data only: a nested map or list is left to parse_event (as the relay's column check leaves it
#: to its row checks).
_Value = Union[_Int64, float, str, bool, None]


class Line(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One journal line's event, each field checked as it was decoded; ``run`` still needs
    ``valid_run`` (a pattern costs more per line in msgspec than once per run here)."""

    run: str
    rank: _Rank
    seq: _Seq
    ts: _Ts
    type: Literal[tuple(sorted(EVENT_TYPES))]  # type: ignore[valid-type]
    data: dict[_Name, _Value]
    v: Literal[schema.SCHEMA_VERSION] = schema.SCHEMA_VERSION  # type: ignore[valid-type]
    local_rank: _Rank = 0
    world_size: Annotated[int, Meta(gt=0, lt=schema.MAX_RANK)] = 1
    host: _Name = ""
    step: Optional[_Seq] = None
    epoch: _Epoch = None
    stage: Optional[_Name] = None


if set(Line.__struct_fields__) != set(FIELDS):
    raise ImportError("relay/wire/typed_lines.py's Line does not have the event model's fields "
                      f"{sorted(set(Line.__struct_fields__) ^ set(FIELDS))}: give it each one, with its rule")

#: (v, run, rank, local_rank, world_size, host) of a Line, in one C call.
envelope_of = attrgetter(*ENVELOPE)
#: (seq, ts, type, step, epoch, stage, data) of a Line.
row_of = attrgetter(*ROW_FIELDS)
#: (run, rank, seq): what dedupe needs.
key_of = attrgetter("run", "rank", "seq")
run_of = attrgetter("run")

_decode = msgspec.json.Decoder(Line).decode
_runs: set[str] = set()  # run ids RUN_ID_RE passed


def decode(lines: list[bytes]) -> list[Line | None]:
    """Each line as a Line, or None where the typed rules refuse it (parse_event then decides)."""
    try:
        items: list[Line | None] = [_decode(line) for line in lines]
    except msgspec.DecodeError:  # (a ValidationError too) some line is not one: line by line
        items = [_one(line) for line in lines]
    runs = set(map(run_of, filter(None, items)))
    if runs <= _runs:
        return items
    bad = {run for run in runs if not _valid_run(run)}
    return [None if item is None or item.run in bad else item for item in items] if bad else items


def _one(line: bytes) -> Line | None:
    try:
        return _decode(line)
    except msgspec.DecodeError:
        return None


def _valid_run(run: str) -> bool:
    if not schema.valid_run_id(run):
        return False
    if len(_runs) >= 4096:
        _runs.clear()
    _runs.add(run)
    return True
