"""Where a restarted nats sink resumes a source, so that nothing the stream already holds goes twice.

A chunk's ``Nats-Msg-Id`` names its byte range, and JetStream drops a message id it has seen; but a
chunk cut again after a restart rarely has the old bounds (the old ones were cut as lines trickled
in, the new ones from a backlog), so its id is new and its lines would be stored twice. The state
file lags what JetStream acknowledged (it is saved twice a second, and chunks are in flight when a
relay is killed), so a restart asks the stream: every message of this node and run stored after
the state's *floor* (a stream sequence below that of any chunk not yet behind the saved position)
is read back, a stored range that starts at the position moves it past, and a stored range further
on (a chunk stored while one before it was still being retried) is a range the new chunks must end
at and step over (``plan``). ``stored_after`` is the walk; ``plan`` is clock- and socket-free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Stored:
    """A chunk of this journal file the stream holds: its byte range and stream sequence."""

    start: int
    end: int
    seq: int


def stored_of(msg: Any, file: str, run: str | None) -> Stored | None:
    """The range of a stream message, when it is a chunk of ``file`` (of ``run``, when given)."""
    headers = msg.headers or {}
    name, _, end = (headers.get("Relay-End") or "").rpartition(":")
    start, _, last = (headers.get("Nats-Msg-Id") or "").rpartition(":")[2].partition("-")
    if name != file or not (start.isdigit() and end.isdigit() and last == end):
        return None
    if run is not None and headers.get("Relay-Run") != run:
        return None
    return Stored(int(start), int(end), int(msg.seq))


def plan(offset: int, stored: list[Stored]) -> tuple[int, list[Stored]]:
    """(the position past everything stored from ``offset`` on without a gap, the stored ranges
    beyond a gap in file order): new chunks end where each of those starts, and step over it."""
    ahead: list[Stored] = []
    for piece in sorted(stored, key=lambda s: (s.start, -s.end)):
        if piece.end <= offset or (ahead and piece.end <= ahead[-1].end):
            continue  # behind the position, or inside a range already kept
        if piece.start <= offset:
            offset = piece.end
        elif ahead and piece.start < ahead[-1].end:  # overlapping ranges (stored twice before): one range
            ahead[-1] = Stored(ahead[-1].start, piece.end, min(ahead[-1].seq, piece.seq))
        else:
            ahead.append(piece)
    return offset, ahead


async def stored_after(js: Any, stream_name: str, subject: str, floor: int, file: str,
                       run: str | None) -> list[Stored]:
    """Every chunk of ``file`` on ``subject`` the stream stored after sequence ``floor``, one
    request a message (a restart's few: what the state file had not caught up with)."""
    from nats.js.errors import NotFoundError
    found: list[Stored] = []
    seq = floor + 1
    while True:
        try:
            msg = await js.get_msg(stream_name, seq=seq, subject=subject, next=True)
        except NotFoundError:
            return found
        piece = stored_of(msg, file, run)
        if piece is not None:
            found.append(piece)
        seq = int(msg.seq) + 1
