"""One partition of the stream as a consuming relay holds it: its own journal, dedupe and sinks.

A partition's journal is the folder ``<path>/p<k>/`` (one ``<run>.jsonl`` per run; a run is on one
partition, so in one journal). It moves between consuming relays with the partition's lease, so it
lives on storage every consuming relay can reach; its lock (relay/journal/journal.py) makes sure
that only one relay writes it at a time, whatever the leases say. A relay that takes a partition
over learns from the journal what is already there (``Dedupe.lookup``), so the messages the last
holder journaled but had not acknowledged, redelivered by JetStream, are not written twice: the
relay's own dedupe by (run, rank, seq) is the guarantee, JetStream's time-bounded one only saves work.

``take`` keeps each message's new lines, byte for byte as the node wrote them; ``commit`` appends
them to the journal in one write and flushes, and only then does the caller acknowledge the
messages; every other sink's process gets exactly the lines the journal took, through the daemon's
own commit step (relay/daemon/commit.py's ``JournalQueue``).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.daemon.commit import JournalQueue
from relay.journal.dedupe import Dedupe, RankState
from relay.journal.journal import Journal
from relay.journal.reader import journal_files
from relay.daemon.fan_out import FanOut
from relay.sinkhost.child import SinkSpec
from relay.wire.lines import ChunkCheck

log = logging.getLogger(__name__)


@dataclass
class PartitionCounters:
    messages: int = 0
    written: int = 0
    duplicates: int = 0
    bad_lines: int = 0


@dataclass
class Partition:
    """Partition ``number``'s journal under ``root`` and its sinks' processes."""

    number: int
    root: Path
    sinks: list[SinkSpec]
    fsync: bool = False
    sink_queue: int = 200_000
    shutdown_timeout: float = 10.0
    counters: PartitionCounters = field(default_factory=PartitionCounters)

    def __post_init__(self) -> None:
        self.journal = Journal(f"{self.root / f'p{self.number}'}{os.sep}", fsync=self.fsync)
        self.dedupe = Dedupe()
        self.fan_out = FanOut()
        self._queue = JournalQueue()
        self.check = ChunkCheck(self._bad_line)
        self.pending = 0  # messages of the partition in the stream not yet delivered, after the last fetch
        self.published: float | None = None  # unix time of the last message fetched

    def open(self) -> None:
        """Lock the journal (JournalError if another relay still writes it); start the sinks if it holds
        runs already (they catch up from it what the last holder's sinks may lack), else at the first
        commit: a partition without runs costs no sink processes."""
        self.journal.open()
        if journal_files(self.journal.path):
            try:
                self._start_sinks()
            except BaseException:
                self.close()
                raise

    def _start_sinks(self) -> None:
        """The daemon's fan-out (relay/daemon/fan_out.py), always fed: no ingest here to make room for."""
        self.fan_out.idle.set()
        self.fan_out.start(self.sinks, self.journal, self.sink_queue, self.shutdown_timeout, None)

    def take_messages(self, msgs: list[Any], now: float) -> None:
        """A fetch's JetStream messages; the last one says what waits behind it in the stream, and since when."""
        for msg in msgs:
            self.take(msg.data, now)
        if msgs:
            meta = msgs[-1].metadata
            self.pending, self.published = meta.num_pending, meta.timestamp.timestamp()

    def take(self, body: bytes, now: float) -> None:
        """Keep the lines of one message that this journal does not hold yet: the message itself when
        it is all new events of one run (the common case: one write of it, not one per line)."""
        self.counters.messages += 1
        lines = [line for line in body.split(b"\n") if line]
        states: dict[tuple[str, int], RankState] = {}
        taken: list[tuple[str, bytes]] = []
        for line, _, envelope, row in self.check.events(lines):
            key = envelope[1:3]  # (run, rank)
            state = states.get(key)
            if state is None:
                state = states[key] = self.dedupe.lookup(key[0], key[1], self.journal)
                self.dedupe.touch(key[0], now)
            if state.take(row[0]):
                taken.append((key[0], line))
            else:
                self.counters.duplicates += 1
        if taken and len(taken) == len(lines) == body.count(b"\n") + (body[-1:] != b"\n") \
                and len({run for run, _ in states}) == 1:  # every line, and no empty one between them
            self._queue.add(taken[0][0], body if body[-1:] == b"\n" else body + b"\n", len(taken))
        else:
            for run, line in taken:
                self._queue.add(run, line + b"\n", 1)

    def _bad_line(self, line: bytes, why: str) -> None:
        self.counters.bad_lines += 1
        log.warning("partition %d: a message line is not an event, skipped (%s): %.200r", self.number, why, line)

    def commit(self) -> None:
        """Journal what ``take`` kept (one write, flushed), handing the sinks what the journal took.
        Raises on a journal failure, keeping the lines it did not take: the caller acknowledges
        nothing and tries again."""
        self._queue.write(self.journal, self._journaled)

    def _journaled(self, lines: bytes, events: int) -> None:
        self.counters.written += events
        if self.sinks and not self.fan_out.workers:
            self._start_sinks()
        if self.fan_out.workers:
            self.fan_out.submit(lines, events)

    def forget_idle(self, before: float) -> None:
        """Drop the dedupe state of runs silent since ``before``; the journal rebuilds it if they return."""
        for run in self.dedupe.idle_runs(before):
            self.dedupe.forget(run)
            self.journal.release(run)

    def close(self) -> None:
        """Let the sinks drain, then unlock the journal for the next holder. Lines not committed are
        dropped: their messages were not acknowledged, so JetStream delivers them again."""
        self.fan_out.close(time.monotonic() + self.shutdown_timeout)
        self.fan_out = FanOut()
        self._queue = JournalQueue()
        try:
            self.journal.close()
        except OSError as exc:
            log.error("partition %d: journal close failed: %s", self.number, exc)

    def stats(self) -> dict:
        lag = time.time() - self.published if self.pending and self.published is not None else 0.0
        out = {"partition": self.number, **self.counters.__dict__, "pending": self.pending, "lag_s": round(lag, 3),
               "sinks": self.fan_out.stats()}
        return out
