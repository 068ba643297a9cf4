"""Journal lines waiting for one write, and the one way they are written (``JournalQueue``): the
relay's commit step (relay/daemon/commit.py) and each partition of a consuming relay
(relay/fleet/partition.py) both hand on exactly what the journal took, once. It lives with the
journal so that neither of the two needs the other's room.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from relay.journal.journal import PartialWrite

#: run -> (events the write held, where the run's file ends after it)
News = dict[str, tuple[int, int]]


def news_of(written: list[tuple[str, bytes]], ends: dict[str, int]) -> News:
    """The news of one journal write: ``written``, its (run, lines) pairs; ``ends``, where each
    run's file ends (``relay.journal.journal.Journal.ends``)."""
    counts: dict[str, int] = {}
    for run, chunk in written:
        counts[run] = counts.get(run, 0) + chunk.count(b"\n")
    return {run: (count, ends.get(run, 0)) for run, count in counts.items()}


class LineJournal(Protocol):
    """What the queue needs of the journal (relay/journal/journal.py)."""

    ends: dict[str, int]

    def write_lines(self, lines: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]: ...

    def flush(self) -> None: ...


#: Hands on what the journal took: its lines, joined; how many events they are; and per run, how
#: many and where its file ends now (what the journal's followers learn, relay/sinkhost/notices.py).
Deliver = Callable[[bytes, int, News], None]


class JournalQueue:
    """A write that fails part way (a directory journal where a later run's file fails) leaves the
    files before it written: their lines are handed on at once and forgotten, so a retry neither
    writes them twice nor leaves them out of the other sinks; the rest wait for the next call."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, bytes]] = []  # (run, one or more of its journal lines)
        self.events = 0  # events in self.lines (one line each)
        self.bytes = 0  # bytes in self.lines
        self.unflushed = False  # written, but the flush after it failed: flushed before any ack

    def add(self, run: str, chunk: bytes, count: int) -> None:
        """``count`` events of ``run``, as their journal lines, wait for the next write."""
        self.lines.append((run, chunk))
        self.events += count
        self.bytes += len(chunk)

    @property
    def due(self) -> bool:
        """Whether a write (or a flush) waits."""
        return bool(self.lines) or self.unflushed

    def write(self, journal: LineJournal, deliver: Deliver) -> None:
        """Append the waiting lines (one write per file), flush, and hand ``deliver`` exactly the
        lines the journal took, with their event count. When the journal fails, what it did take
        is still flushed and delivered (it is never written again), the rest waits for the next
        call, and the error is raised. Once this returns, nothing waits and all is flushed."""
        written: list[tuple[str, bytes]] = []
        events = 0
        error: PartialWrite | None = None
        if self.lines:
            try:
                written = journal.write_lines(self.lines)
                left: list[tuple[str, bytes]] = []
            except PartialWrite as exc:
                written, left, error = exc.written, exc.left, exc
            if written:
                events = self.events if not left else sum(c.count(b"\n") for _, c in written)
                self.lines, self.events = left, self.events - events
                self.bytes = sum(len(chunk) for _, chunk in left)
                self.unflushed = True
        try:
            if self.unflushed:
                journal.flush()
                self.unflushed = False
        finally:
            if written:
                lines = b"".join([chunk for _, chunk in written])
                deliver(lines, events, news_of(written, journal.ends))
        if error is not None:
            raise error
