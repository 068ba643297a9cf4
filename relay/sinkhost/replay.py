"""Rebuild any sink from the JSONL journal (docs/relay.md), driven as its process drives it live
(relay/sinkhost/driver.py), for up to ``RETRY_FOR`` seconds of retries.

Replayed into a journal, only what it lacks is written, and a spool's events get the relay's own
events a live relay would have derived (relay/daemon/rederive.py). A ``CatchesUp`` sink is read no
run back here: it is fed the whole journal, so a hole it names is filled further on or is one for
good.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from relay.journal.deadletter import DeadLetters
from relay.journal.dedupe import Dedupe
from relay.journal.journal import BadRunId, Journal
from relay.journal.reader import journal_files, read_events
from relay.sinkhost.child import starting
from relay.sinkhost.driver import SinkDriver, sleep_for
from relay.wire.lines import SPOOL_SUFFIX, Derived, relay_event
from sinks.base import Sink, SinkContext, SinkError
from sinks.events import RELAY_RANK, from_journal

log = logging.getLogger(__name__)

BATCH = 1000
RETRY_FOR = 60.0  # seconds a sink may keep failing before the replay gives up on it


@dataclass
class ReplayResult:
    files: int = 0
    events: int = 0  # read (of the runs asked for)
    new: int = 0  # of those, written to the journal target: what it did not hold yet
    bad_lines: int = 0
    dead_lettered: int = 0  # refused for good by a sink (each in its dead-letter file)
    derived: int = 0  # the relay's own events derived from spooled ones, written to the journal


class Derivation(Protocol):
    """What derives the relay's own events from events replayed into a journal."""

    def meet(self, run: str, recent: list[dict[str, Any]]) -> None:
        """``run`` is met for the first time: what the journal holds of it last, before any replayed
        event."""

    def take(self, events: list[dict[str, Any]]) -> list[Derived]:
        """New events of the journal, in order: what they settle."""

    def finish(self) -> list[Derived]:
        """The replay is over: what every run's end still settles."""


def replay_files(paths: Iterable[Path], sinks: list[Sink], runs: set[str] | None = None,
                 journal: Journal | None = None, retry_for: float = RETRY_FOR,
                 progress: Callable[[int, int], None] | None = None,
                 derive: Derivation | None = None, deadletters: Path | None = None) -> ReplayResult:
    """Write every event of ``paths`` (files or journal directories) to ``sinks`` in file order, and
    to ``journal`` what it lacks, with what ``derive`` derives from what a spool file adds.

    Lines that are not events (``relay.wire.lines.event_error``), and events ``journal`` refuses,
    are skipped and counted in ``bad_lines``. SinkError when a sink still fails after ``retry_for``
    s. ``progress(events, bytes)`` is told after each batch; ``deadletters``: the folder of the
    sinks' dead-letter files (default: the first file's).
    """
    result = ReplayResult()
    files = [f for p in paths for f in journal_files(Path(p))]
    context = SinkContext(journal=files[0] if len(files) == 1 else None, replay=True)
    target = _JournalTarget(journal, derive) if journal is not None else None
    if journal is not None:
        journal.open()
    drivers: list[SinkDriver] = []
    try:
        for sink in sinks:
            starting(sink.name, sink.open, context)
            dead = _deadletters(files, sink.name, deadletters)
            drivers.append(SinkDriver(sink.name, sink, dead, wait=sleep_for(retry_for)))
        try:
            read = [0]
            for path in files:
                result.files += 1
                if target is not None:
                    target.reading(path)
                bad: list[int] = []
                batch = []
                for event in read_events(path, bad, read_bytes=read):
                    if runs and event.get("run") not in runs:
                        continue
                    batch.append(from_journal(event))
                    if len(batch) >= BATCH:
                        result.new += _write(target, drivers, batch)
                        result.events += len(batch)
                        batch = []
                        if progress is not None:
                            progress(result.events, read[0])
                if batch:
                    result.new += _write(target, drivers, batch)
                    result.events += len(batch)
                if progress is not None:
                    progress(result.events, read[0])
                if bad:
                    log.warning("%s: skipped %d lines that are not valid events (first at line %d; "
                                "--log-level debug says why for each)", path, len(bad), bad[0])
                    result.bad_lines += len(bad)
            if target is not None:
                _write(None, drivers, [from_journal(e) for e in target.finish()])
                result.derived = target.derived
            for driver in drivers:
                if not driver.flush():
                    raise SinkError(f"sink {driver.name} failed to flush at the end of the replay "
                                    f"({driver.last_error}): run it again once the sink works")
            if target is not None and target.refused:
                log.warning("the journal refused %d events", target.refused)
                result.bad_lines += target.refused
        finally:
            for driver in drivers:
                driver.close()
                result.dead_lettered += driver.dead_lettered
    finally:
        if journal is not None:
            journal.close()
    return result


class _JournalTarget:
    """A journal being replayed into: fed only what it lacks (``Journal.seen``, as a restarted
    relay), and, while ``deriving`` (a spool file), what ``derive`` derives from that."""

    def __init__(self, journal: Journal, derive: Derivation | None) -> None:
        self.journal = journal
        self.dedupe = Dedupe()
        self.refused = 0
        self.derive = derive
        self.deriving = False
        self.derived = 0
        self._met: set[str] = set()
        self._host = socket.gethostname()

    def reading(self, path: Path) -> None:
        """The next batches are ``path``'s: a spool file's events are derived from."""
        self.deriving = path.name.endswith(SPOOL_SUFFIX)

    def write(self, batch: list[dict]) -> tuple[int, list[dict]]:
        """Journal what ``batch`` holds that the journal lacks; (how many, the events derived from
        them)."""
        derive = self.derive if self.deriving else None
        fresh = []
        for event in batch:
            if derive is not None and event["run"] not in self._met:
                self._met.add(event["run"])  # before any of its new events is written
                derive.meet(event["run"], self.journal.recent(event["run"]))
            if self._take(event):
                fresh.append(event)
        if fresh:
            self.journal.write(fresh)
        own = self._own(derive.take(fresh)) if derive is not None and fresh else []
        return len(fresh), own

    def finish(self) -> list[dict]:
        """The relay's own events the end of the replay settles (written here)."""
        return self._own(self.derive.finish()) if self.derive is not None and self._met else []

    def _own(self, derived: list[Derived]) -> list[dict]:
        """Derived events, numbered on from what the journal holds of (run, RELAY_RANK), and
        journaled."""
        events = []
        for item in derived:
            state = self.dedupe.lookup(item.run, RELAY_RANK, self.journal)
            seq = state.floor
            state.take(seq)
            events.append(relay_event(item, seq, self._host, time.time()))
        if events:
            self.journal.write(events)
            self.derived += len(events)
        return events

    def _take(self, event: dict) -> bool:
        try:
            state = self.dedupe.lookup(event["run"], event["rank"], self.journal)
        except BadRunId as exc:
            self.refused += 1
            log.debug("not written to the journal: %s", exc)
            return False
        return state.take(event["seq"])


def _write(target: _JournalTarget | None, drivers: list[SinkDriver], batch: list[dict]) -> int:
    """Write ``batch`` to the journal target first, then to each sink (with what the target derived
    from it); the events new to the journal."""
    new, own = target.write(batch) if target is not None else (0, [])
    batch = batch + [from_journal(e) for e in own] if own else batch
    if not batch:
        return new
    for driver in drivers:
        if not driver.write(batch):
            raise SinkError(f"sink {driver.name} kept failing ({driver.last_error}); "
                            "the replay stopped: run it again once the sink works")
        driver.after_batch(idle=False)
    return new


def _deadletters(files: list[Path], name: str, folder: Path | None = None) -> DeadLetters | None:
    """The dead-letter file of sink ``name`` in ``folder``, else beside the journal replayed (the
    relay's own for it)."""
    if folder is None and not files:
        return None
    where = folder if folder is not None else files[0].parent
    return DeadLetters(Journal(str(where) + os.sep).sidecar(f"_deadletter_{name}.jsonl"))
