"""The event model, in one place: an event's fields (the envelope and the row of a compact batch),
its types, the relay's own rank and the JSON form of non-finite numbers. Every module that names
fields takes them from here (the wire's framing, the journal's lines, the forward sink, the spool),
so a new field is one edit here: its name and its kind of value, from whose rule the wire derives
every check (relay/wire/schema.py refuses to load for a kind it has no rule for). It lives in sinks,
the lowest layer, so the imports run one way (relay -> sinks) and a sink never needs the relay's
code.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypedDict, cast

#: Known event types (docs/protocol.md); a new type is a schema change.
EVENT_TYPES = frozenset({"hello", "params", "metrics", "lifecycle", "stats"})
#: Who sent an event, the same for every event of one (run, rank): a compact batch sends it once.
#: Each field with its kind of value; what a valid value of a kind is (its type, range, length) is
#: the wire's rule table, relay/wire/schema.py KINDS; ``| None``: nil is valid too.
ENVELOPE_KINDS: dict[str, str] = {"v": "version", "run": "run_id", "rank": "rank",
                                  "local_rank": "rank", "world_size": "world_size", "host": "name"}
#: What each event says: one row of a compact batch (fields and kinds as above).
ROW_KINDS: dict[str, str] = {"seq": "count", "ts": "unix_time", "type": "event_type",
                             "step": "count | None", "epoch": "epoch | None",
                             "stage": "name | None", "data": "map"}
ENVELOPE: tuple[str, ...] = tuple(ENVELOPE_KINDS)
ROW_FIELDS: tuple[str, ...] = tuple(ROW_KINDS)
#: Every field, in the order the client writes them and the journal keeps them.
FIELDS: tuple[str, ...] = ENVELOPE + ROW_FIELDS


class Event(TypedDict):
    """One event as a sink is handed it (docs/protocol.md), for a type checker and an editor's
    completion: the same fields as above, in the same order, checked when this module loads."""

    v: int
    run: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    seq: int
    ts: float
    type: str
    step: int | None
    epoch: float | None
    stage: str | None
    data: dict[str, Any]


if tuple(Event.__annotations__) != FIELDS:
    raise ImportError(f"sinks/events.py: Event lists {tuple(Event.__annotations__)}, the kinds "
                      f"{FIELDS}: give a new field its kind and its type in Event, in the same "
                      "place")


def as_event(event: dict[str, Any]) -> Event:
    """An event the relay has checked (on the wire, or as the journal line it wrote), typed as one:
    no copy and no check, only the type checker told."""
    return cast(Event, event)


def as_events(events: Sequence[dict[str, Any]]) -> Sequence[Event]:
    """``as_event`` for a batch."""
    return cast("Sequence[Event]", events)

#: The rank of the events the relay derives itself (``stage="cluster"``: cross-rank step-time
#: figures, stragglers, lost ranks; docs/protocol.md): the largest rank the wire allows, which no
#: client may use.
RELAY_RANK = (1 << 24) - 1

#: Each attempt of a run (a job resumed from a checkpoint, docs/trainer.md) numbers every rank's
#: seqs from ``attempt_base(attempt)``, so no event of it repeats a seq of an earlier attempt of the
#: same run (docs/protocol.md). 2**32 events per rank per attempt; attempts below MAX_ATTEMPT keep
#: every seq below 2**53, which JSON readers that hold numbers as doubles (jq) still read exactly.
ATTEMPT_SEQ_BITS = 32
MAX_ATTEMPT = 1 << 21


def attempt_base(attempt: int) -> int:
    """The first seq of every rank of a run's ``attempt`` (0 for its first)."""
    return attempt << ATTEMPT_SEQ_BITS


def attempt_of(seq: int) -> int:
    """The attempt that numbered ``seq``."""
    return seq >> ATTEMPT_SEQ_BITS


#: Within an attempt, torchrun's elastic restarts of a rank (``TORCHELASTIC_RESTART_COUNT``) number
#: on from ``session_base(attempt, restart)``: 2**24 events per rank per restart, restarts 0 .. 255
#: (a later one shares the last range: refused as a second writer if it meets the last's events).
RESTART_SEQ_BITS = 24
MAX_RESTART = 1 << (ATTEMPT_SEQ_BITS - RESTART_SEQ_BITS)


def session_base(attempt: int, restart: int = 0) -> int:
    """The first seq a publisher of ``attempt`` started for the ``restart``-th time numbers from."""
    return attempt_base(attempt) + (min(max(restart, 0), MAX_RESTART - 1) << RESTART_SEQ_BITS)


def starts_session(seq: int) -> bool:
    """Whether ``seq`` can be the first of a publisher's session (a ``session_base``): the gap below
    it is an earlier session's end, not a hole to wait for."""
    return seq & ((1 << RESTART_SEQ_BITS) - 1) == 0


NONFINITE_JSON = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def json_safe(obj: Any) -> Any:
    """Replace non-finite floats by the strings "NaN", "Infinity", "-Infinity" (as protobuf's JSON
    mapping does), so JSON lines stay valid for jq while keeping the signal."""
    kind = type(obj)
    if kind is float:
        if math.isfinite(obj):
            return obj
        return "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
    if kind is dict:
        return {k: json_safe(v) for k, v in obj.items()}
    if kind is list:
        return [json_safe(v) for v in obj]
    return obj


def from_journal(event: dict[str, Any]) -> dict[str, Any]:
    """An event read back from its journal line as the relay took it: non-finite metrics restored.
    What replay and the sink processes hand to sinks, so live and replayed sinks see the same."""
    if event.get("type") == "metrics" and type(event.get("data")) is dict:
        event["data"] = from_json_metrics(event["data"])
    return event


def from_json_metrics(data: dict[str, Any]) -> dict[str, Any]:
    """Inverse of json_safe for metric values read back from JSONL (replay): "NaN" -> nan."""
    return {k: (NONFINITE_JSON[v] if type(v) is str and v in NONFINITE_JSON else
                from_json_metrics(v) if type(v) is dict else v) for k, v in data.items()}
