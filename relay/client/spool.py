"""The spool's format: what a closing Publisher (relay/client/publisher.py) writes when the relay
never acknowledged some events, line for line what the relay would have journaled, so that ``relay
replay`` (which skips what the journal already holds) delivers exactly the missing ones."""
from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from typing import Any

import msgpack

from relay.wire import schema
from sinks.events import ROW_FIELDS

#: What the replay command of the close warning names when the relay's journal is not known here.
UNKNOWN_JOURNAL = "YOUR_JOURNAL"


def told(address: str, count: int, run: str, rank: int, path: str, journal: str | None,
         refused: str | None) -> str:
    """What a closing Publisher says of the events it spooled: the command that delivers them, or,
    when the relay refused the stream (another process writes it, ``refused`` says which), why not:
    replayed into that run, they would be taken for its writer's."""
    lost = f"relay {address}: {count} events of run {run} rank {rank} were never acknowledged"
    if refused:
        return f"{lost}: {refused}; spooled in {path}"
    where = "the journal" if journal is not None else f"the journal of the relay at {address}"
    target = shlex.quote(journal or UNKNOWN_JOURNAL)
    return (f"{lost}; spooled, deliver them to {where} with: relay replay {shlex.quote(path)} "
            f"--sink jsonl --path {target}")


def row_event(envelope: Mapping[str, Any], blob: bytes) -> dict[str, Any]:
    """One encoded row as the relay would journal it: decoded as the relay decodes, the envelope
    added, and checked by the relay's rules; ValueError where the relay would reject it."""
    row = msgpack.unpackb(blob, raw=False, strict_map_key=True, use_list=True)
    event = {**envelope, **dict(zip(ROW_FIELDS, row, strict=True))}
    schema.validate_event(event)
    return event


#: An encoded row no longer than this always fits a journal line: JSON takes at most 6 bytes for one
#: byte on the wire, and the envelope (a 256-char host escaped included) under 2 KiB more.
LINE_SAFE_BYTES = schema.MAX_LINE_BYTES // 8


def line_too_long(envelope: Mapping[str, Any], blob: bytes) -> bool:
    """Whether the relay would refuse this row for its journal line (schema.MAX_LINE_BYTES): a
    Publisher drops such an event, counted, rather than resending it forever. Rows of at most
    LINE_SAFE_BYTES need not ask."""
    from relay.wire.lines import encode_line  # as rare as such events

    try:
        return len(encode_line(row_event(envelope, blob))) > schema.MAX_LINE_BYTES
    except ValueError:  # the relay rejects it for what it is, as it would any other
        return False


def append(path: str, events: list[dict[str, Any]]) -> None:
    """Append the events' journal lines to ``path`` and fsync, all or nothing: no half line for
    replay to trip over. Raises OSError."""
    # only a Publisher that has to spool pays for this import
    from relay.wire.lines import encode_line

    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    # the job's events: its user's alone
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        view = memoryview(b"".join([encode_line(event) for event in events]))
        try:
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)
