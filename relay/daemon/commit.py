"""The commit step: accepted events wait here as journal lines until one write puts them in the
journal; only then are their senders acknowledged and the same lines handed to the other sinks.

So an ack always means "in the journal". A failing journal keeps every line (retried with backoff,
no acks meanwhile, and ingest stops reading at MAX_UNJOURNALED: clients keep their events). No
socket and no clock of its own: the caller gives the time, a ``fan_out`` for the other sinks and a
``send`` for the acks (the daemon's ROUTER socket, relay/daemon/loop.py; none before it binds).
"""
from __future__ import annotations

import logging
from typing import Callable, Mapping, Protocol

from relay.daemon.bounds import COMMIT_BYTES
from relay.daemon.counters import Counters
from relay.journal.dedupe import RankState

log = logging.getLogger("relay")

MAX_UNJOURNALED = 200_000  # stop reading (clients keep their events) while the journal is failing
MAX_BACKOFF = 5.0  # seconds between journal retries, at most

#: One connection's cumulative acks: (run, rank, the next seq it may send).
Acks = list[tuple[str, int, int]]


class LineJournal(Protocol):
    """What the commit step needs of the journal (relay/journal/journal.py)."""

    def write_lines(self, lines: list[tuple[str, bytes]]) -> None: ...

    def flush(self) -> None: ...


class Commit:
    """The lines waiting for the journal, the streams waiting for an ack, and the journal's backoff."""

    def __init__(self, journal: LineJournal, counters: Counters, ranks: Mapping[tuple[str, int], RankState],
                 now: float) -> None:
        self.journal = journal
        self.counters = counters
        self.ranks = ranks  # each stream's dedupe state: its owner and its floor are the ack
        #: the other sinks' share of each written batch (lines, events); None: no other sinks
        self.fan_out: Callable[[bytes, int], None] | None = None
        #: sends one connection its acks; None: no one to acknowledge (before the socket is bound)
        self.send: Callable[[bytes, Acks], None] | None = None
        # Accepted events as (run, journal lines) chunks, encoded on arrival while they are still in
        # the CPU's cache; the other sinks get the same lines.
        self.lines: list[tuple[str, bytes]] = []
        self.pending = 0  # events in self.lines
        self.pending_bytes = 0  # bytes in self.lines
        self.acks_due: set[tuple[str, int]] = set()  # acks go to each stream's owner (relay/journal/dedupe.py)
        self.derived_runs: set[str] = set()  # runs with derived events not journaled yet
        self.backoff = 0.0
        self.retry_at = 0.0
        self.ok_at = now  # the last journal write that worked

    def add(self, run: str, chunk: bytes, count: int) -> None:
        """``count`` events of ``run``, as their journal lines, wait for the next commit."""
        self.lines.append((run, chunk))
        self.pending += count
        self.pending_bytes += len(chunk)

    @property
    def reading(self) -> bool:
        """Whether ingest may read more: not while COMMIT_BYTES or MAX_UNJOURNALED wait."""
        return self.pending < MAX_UNJOURNALED and self.pending_bytes < COMMIT_BYTES

    @property
    def full(self) -> bool:
        """Enough lines wait that they go to the journal now, whatever the flush interval says."""
        return self.pending_bytes >= COMMIT_BYTES

    def holds(self, run: str, ranks: list[int]) -> bool:
        """Whether ``run`` has lines or acks waiting (its state must not be forgotten before)."""
        return run in self.derived_runs or any((run, rank) in self.acks_due for rank in ranks)

    def commit(self, now: float) -> None:
        """Journal the batch, acknowledge, then fan out; on a journal failure keep everything."""
        lines = self.lines
        if lines:
            if now < self.retry_at:
                return
            try:
                self.journal.write_lines(lines)
                self.journal.flush()
            except Exception as exc:  # counted and retried with backoff; no acks until it works
                self._failed(exc, now)
                return
            self.backoff = 0.0
            self.ok_at = now
            self.counters.written += self.pending
            if self.fan_out is not None:
                self.fan_out(b"".join([chunk for _, chunk in lines]), self.pending)
            self.lines, self.pending, self.pending_bytes = [], 0, 0
            self.derived_runs.clear()
        self._acknowledge()

    def retry_now(self) -> None:
        """Forget the backoff (at shutdown: one more try at once)."""
        self.retry_at = 0.0

    def _failed(self, exc: Exception, now: float) -> None:
        lines = self.lines
        left = sum(chunk.count(b"\n") for _, chunk in lines)  # one newline per event
        self.counters.written += self.pending - left  # files that did take their part
        self.pending = left
        self.pending_bytes = sum(len(chunk) for _, chunk in lines)
        self.counters.journal_errors += 1
        self.backoff = min(max(self.backoff * 2, 0.1), MAX_BACKOFF)
        self.retry_at = now + self.backoff
        log.error("journal write failed (%d errors, %d events waiting), retrying in %.1f s: %s: %s",
                  self.counters.journal_errors, self.pending, self.backoff, type(exc).__name__, exc)

    def _acknowledge(self) -> None:
        """Each stream's owner gets its cumulative ack, one message per connection."""
        if not self.acks_due:
            return
        per_peer: dict[bytes, Acks] = {}
        ranks = self.ranks
        for key in self.acks_due:
            state = ranks[key]
            peer = state.owner
            if peer is not None:  # gone: its next connection is acknowledged when it sends
                per_peer.setdefault(peer, []).append((key[0], key[1], state.ack_for(peer)))
        self.acks_due.clear()
        if self.send is not None:
            for peer, acks in per_peer.items():
                self.send(peer, acks)

    def journal_stats(self, now: float) -> dict[str, float]:
        """The journal's figures as the status shows each sink's (lag: since the last write that worked)."""
        return {"written": self.counters.written, "errors": self.counters.journal_errors, "dropped": 0,
                "queued": self.pending, "lag_s": round(now - self.ok_at, 1) if self.pending else 0.0}
