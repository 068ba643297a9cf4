"""Where a restarted nats sink resumes a source, so that nothing the stream holds goes twice
(docs/sinks/nats.md, "What it does"): a chunk cut again rarely has its old bounds, so its id is new.

``stored_after`` is the walk back from the state's floor; ``plan`` is clock- and socket-free;
``resume_at`` is the publisher's question, asked until the stream answers.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relay.fleet import connection

log = logging.getLogger("relay.fleet.nats_sink")


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
        # overlapping ranges (stored twice before): one range
        elif ahead and piece.start < ahead[-1].end:
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


async def resume_at(js: Any, stream_name: str, subject: str, file: str, run: str | None,
                    known: tuple[str, int, int | None] | None,
                    count_error: Callable[[str], None]) -> tuple[int, int, list[Stored]] | None:
    """(offset, floor, the stored ranges to step over) of a source of ``file`` whose saved position
    is ``known`` (None: the state file does not know it: after the stream's last message on
    ``subject``, None when there is none); the stream asked until it answers, each failure counted
    with ``count_error``."""
    if known is None:
        last = await _asking(subject, lambda: js.get_last_msg(stream_name, subject), count_error)
        piece = stored_of(last, file, run) if last is not None else None
        if piece is None:
            return None
        stored: list[Stored] = []
        offset, floor = piece.end, piece.seq
        log.info("%s: resuming after the stream's last message, at byte %s", file, offset)
    else:
        _, offset, known_floor = known
        assert known_floor is not None  # (the caller returns where it is None)
        floor = known_floor
        stored = await _asking(subject, lambda: stored_after(
            js, stream_name, subject, floor, file, run), count_error) or []
    saved = offset
    offset, ahead = plan(offset, stored)
    if offset != saved or ahead:
        log.info("%s: the stream holds chunks past the saved position (byte %d): resuming at byte "
                 "%d%s", file, saved, offset,
                 f", {len(ahead)} stored further on stepped over" if ahead else "")
    return offset, floor, ahead


async def _asking(subject: str, ask: Any, count_error: Callable[[str], None]) -> Any:
    """``ask()`` until JetStream answers (None: it has no such message)."""
    from nats.js.errors import NotFoundError
    while True:
        try:
            return await ask()
        except NotFoundError:
            return None
        except connection.failures() as exc:  # timeouts, connection loss: asked again
            count_error(f"looking up the stream's messages for {subject}: "
                        f"{connection.describe(exc)}")
            await asyncio.sleep(1.0)
