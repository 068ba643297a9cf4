"""Rebuild any sink from the JSONL journal: the journal is the source of truth, so a sink that
was down, added later or lost can be brought back to what it would have been live. Replayed into a
journal (``--sink jsonl``: a spool into the relay's journal, say), only what that journal lacks is
written, so replaying twice adds nothing.

Each sink is driven as its process drives it live (relay/sinkhost/driver.py): retried with backoff
(for up to ``RETRY_FOR`` seconds), events it refuses for good dead-lettered beside the journal
(``_relay_deadletter_NAME.jsonl``, as the relay's own), flushed every second and at the end."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from relay.journal.deadletter import DeadLetters
from relay.journal.dedupe import Dedupe
from relay.journal.journal import BadRunId, Journal
from relay.journal.reader import JournalReader, journal_files, read_events
from relay.sinkhost.driver import SinkDriver, sleep_for
from sinks.base import Sink, SinkContext, SinkError
from sinks.events import from_journal

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


def replay_files(paths: Iterable[Path], sinks: list[Sink], runs: set[str] | None = None,
                 journal: Journal | None = None, retry_for: float = RETRY_FOR,
                 progress: Callable[[int, int], None] | None = None) -> ReplayResult:
    """Write every event of ``paths`` (files or journal directories) to ``sinks`` in file order,
    and to ``journal`` what it lacks.

    Non-finite metric values, stored as "NaN"/"Infinity" strings, become floats again. Sinks are
    expected to be idempotent, so replaying twice adds nothing. Lines that are not events (see
    ``relay.wire.lines.event_error``: unparsable, hand-edited, an older relay's "NaN" ts) are skipped
    and counted in ``bad_lines``, as are events ``journal`` refuses (a run id it cannot name a file
    after, which the reader already keeps out). SinkError when a sink still fails after ``retry_for`` s.
    ``progress(events, bytes)`` is told after each batch how many events and bytes were read so far.
    """
    result = ReplayResult()
    files = [f for p in paths for f in journal_files(Path(p))]
    single = files[0] if len(files) == 1 else None
    context = SinkContext(journal=single, journal_events=JournalReader(single) if single else None, replay=True)
    target = _JournalTarget(journal) if journal is not None else None
    if journal is not None:
        journal.open()
    drivers: list[SinkDriver] = []
    try:
        for sink in sinks:
            sink.open(context)
            drivers.append(SinkDriver(sink.name, sink, _deadletters(files, sink.name), wait=sleep_for(retry_for)))
        try:
            read = [0]
            for path in files:
                result.files += 1
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
    """A journal being replayed into: fed only what it lacks (``Journal.seen``, as a restarted relay)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.dedupe = Dedupe()
        self.refused = 0

    def write(self, batch: list[dict]) -> int:
        fresh = [e for e in batch if self._take(e)]
        if fresh:
            self.journal.write(fresh)
        return len(fresh)

    def _take(self, event: dict) -> bool:
        try:
            state = self.dedupe.lookup(event["run"], event["rank"], self.journal)
        except BadRunId as exc:
            self.refused += 1
            log.debug("not written to the journal: %s", exc)
            return False
        return state.take(event["seq"])


def _write(target: _JournalTarget | None, drivers: list[SinkDriver], batch: list[dict]) -> int:
    """Write ``batch`` to the journal target first, then to each sink; the events new to the journal."""
    new = target.write(batch) if target is not None else 0
    for driver in drivers:
        if not driver.write(batch):
            raise SinkError(f"sink {driver.name} kept failing ({driver.last_error}); "
                            "the replay stopped: run it again once the sink works")
        driver.after_batch(idle=False)
    return new


def _deadletters(files: list[Path], name: str) -> DeadLetters | None:
    """The dead-letter file of sink ``name`` beside the journal replayed (the relay's own for it)."""
    if not files:
        return None
    return DeadLetters(Journal(str(files[0].parent) + os.sep).sidecar(f"_deadletter_{name}.jsonl"))
