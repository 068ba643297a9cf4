"""The commit step: accepted events wait here as journal lines until one write puts them in the
journal; only then are their senders acknowledged and the same lines handed to the other sinks.

So an ack always means "in the journal". A failing journal keeps every line it did not take
(retried with backoff, no acks meanwhile, and ingest stops reading at MAX_UNJOURNALED: clients keep
their events). The other sinks get exactly the lines the journal took, each once, even when a write
fails part way (relay/journal/journal_queue.py's ``JournalQueue``, which a consuming relay's
partitions use too).
No socket and no clock of its own: the caller gives the time, and at construction a ``send`` for the
acks (the daemon's ROUTER socket, relay/daemon/loop.py) and a ``fan_out`` for the other sinks.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from relay.daemon.bounds import COMMIT_BYTES
from relay.daemon.counters import Counters
from relay.journal.dedupe import RankState
from relay.journal.journal import JournalError
from relay.journal.journal_queue import Deliver, JournalQueue, LineJournal, News

log = logging.getLogger("relay")

MAX_UNJOURNALED = 200_000  # stop reading (clients keep their events) while the journal is failing
MAX_BACKOFF = 5.0  # seconds between journal retries, at most

#: One connection's cumulative acks: (run, rank, the next seq it may send).
Acks = list[tuple[str, int, int]]
#: Sends one connection (its routing id) its acks.
Send = Callable[[bytes, Acks], None]


class Commit:
    """The lines waiting for the journal, the streams waiting for an ack, the journal's backoff."""

    def __init__(self, journal: LineJournal, counters: Counters,
                 ranks: Mapping[tuple[str, int], RankState],
                 owners: Mapping[tuple[str, int], bytes], now: float, *, send: Send,
                 fan_out: Deliver | None = None) -> None:
        self.journal = journal
        self.counters = counters
        self.ranks = ranks  # each stream's dedupe state: its floor is the ack
        #: each stream's connection (relay/daemon/owners.py), whom the ack goes to
        self.owners = owners
        self.send = send  # each connection's acks
        #: the other sinks' share of each written batch (lines, events, news); None: none
        self.fan_out = fan_out
        # Accepted events as (run, journal lines) chunks, encoded on arrival while they are still in
        # the CPU's cache; the other sinks get the same lines.
        self.queue = JournalQueue()
        self.acks_due: set[tuple[str, int]] = set()  # acks go to each stream's owner
        self.derived_runs: set[str] = set()  # runs with derived events not journaled yet
        self.backoff = 0.0
        self.retry_at = 0.0
        self.ok_at = now  # the last journal write that worked

    def add(self, run: str, chunk: bytes, count: int) -> None:
        """``count`` events of ``run``, as their journal lines, wait for the next commit."""
        self.queue.add(run, chunk, count)

    def add_derived(self, run: str, line: bytes) -> None:
        """One of the relay's own events (no one is acknowledged for it): ``run``'s state stays
        until it is journaled (``holds``)."""
        self.queue.add(run, line, 1)
        self.derived_runs.add(run)

    def ack_due(self, key: tuple[str, int]) -> None:
        """``key``'s owner is acknowledged at the next commit."""
        self.acks_due.add(key)

    def drop_acks(self) -> None:
        """Every connection is gone: no ack is due (each client resends, acknowledged then)."""
        self.acks_due.clear()

    @property
    def lines(self) -> list[tuple[str, bytes]]:
        """The (run, lines) chunks the journal has not taken yet."""
        return self.queue.lines

    @property
    def pending(self) -> int:
        """Events the journal has not taken yet."""
        return self.queue.events

    @property
    def reading(self) -> bool:
        """Whether ingest may read more: not while COMMIT_BYTES or MAX_UNJOURNALED wait."""
        return self.queue.events < MAX_UNJOURNALED and self.queue.bytes < COMMIT_BYTES

    @property
    def full(self) -> bool:
        """Enough lines wait that they go to the journal now, whatever the flush interval says."""
        return self.queue.bytes >= COMMIT_BYTES

    def holds(self, run: str, ranks: list[int]) -> bool:
        """Whether ``run`` has lines or acks waiting (its state must not be forgotten before)."""
        return run in self.derived_runs or any((run, rank) in self.acks_due for rank in ranks)

    def commit(self, now: float) -> None:
        """Journal the batch, then acknowledge; the other sinks get what the journal took, as it
        takes it. On a journal failure keep the rest and acknowledge nothing."""
        if self.queue.due:
            if now < self.retry_at:
                return
            try:
                self.queue.write(self.journal, self._journaled)
            except (JournalError, OSError) as exc:  # counted, retried; no acks until it works
                self._failed(exc, now)
                return
            self.backoff = 0.0
            self.ok_at = now
            self.derived_runs.clear()
        self._acknowledge()

    def _journaled(self, lines: bytes, events: int, news: News) -> None:
        self.counters.written += events
        if self.fan_out is not None:
            self.fan_out(lines, events, news)

    def retry_now(self) -> None:
        """Forget the backoff (at shutdown: one more try at once)."""
        self.retry_at = 0.0

    def _failed(self, exc: JournalError | OSError, now: float) -> None:
        self.counters.journal_errors += 1
        self.backoff = min(max(self.backoff * 2, 0.1), MAX_BACKOFF)
        self.retry_at = now + self.backoff
        log.error("journal write failed (%d errors, %d events waiting), retrying in %.1f s: %s: %s",
                  self.counters.journal_errors, self.pending, self.backoff,
                  type(exc.__cause__ or exc).__name__, exc)

    def _acknowledge(self) -> None:
        """Each stream's owner gets its cumulative ack, one message per connection."""
        if not self.acks_due:
            return
        per_peer: dict[bytes, Acks] = {}
        ranks, owners = self.ranks, self.owners
        for key in self.acks_due:
            peer = owners.get(key)
            if peer is not None:  # gone: its next connection is acknowledged when it sends
                per_peer.setdefault(peer, []).append((key[0], key[1], ranks[key].ack_for(peer)))
        self.acks_due.clear()
        for peer, acks in per_peer.items():
            self.send(peer, acks)

    def journal_stats(self, now: float) -> dict[str, float]:
        """The journal's figures, as the status shows a sink's (lag: since its last good write)."""
        lag = round(now - self.ok_at, 1) if self.queue.due else 0.0
        return {"written": self.counters.written, "errors": self.counters.journal_errors,
                "dropped": 0, "queued": self.pending, "lag_s": lag}
