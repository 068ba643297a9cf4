"""Rebuild any sink from the JSONL journal: the journal is the source of truth, so a sink that
was down, added later or lost can be brought back to what it would have been live. Replayed into a
journal (``--sink jsonl``: a spool into the relay's journal, say), only what that journal lacks is
written, so replaying twice adds nothing."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from relay.journal.dedupe import Dedupe
from relay.journal.journal import BadRunId, Journal, JournalReader, journal_files, read_events
from sinks.base import Sink, SinkContext
from sinks.events import from_journal

log = logging.getLogger(__name__)

BATCH = 1000


@dataclass
class ReplayResult:
    files: int = 0
    events: int = 0  # read (of the runs asked for)
    new: int = 0  # of those, written to the journal target: what it did not hold yet
    bad_lines: int = 0


def replay_files(paths: Iterable[Path], sinks: list[Sink], runs: set[str] | None = None,
                 journal: Journal | None = None) -> ReplayResult:
    """Write every event of ``paths`` (files or journal directories) to ``sinks`` in file order,
    and to ``journal`` what it lacks.

    Non-finite metric values, stored as "NaN"/"Infinity" strings, become floats again. Sinks are
    expected to be idempotent, so replaying twice adds nothing. Lines that are not events (see
    ``relay.journal.journal.event_error``: unparsable, hand-edited, an older relay's "NaN" ts) are skipped
    and counted in ``bad_lines``, as are events ``journal`` refuses (a run id it cannot name a file
    after, which the reader already keeps out).
    """
    result = ReplayResult()
    files = [f for p in paths for f in journal_files(Path(p))]
    single = files[0] if len(files) == 1 else None
    context = SinkContext(journal=single, journal_events=JournalReader(single) if single else None, replay=True)
    target = _JournalTarget(journal) if journal is not None else None
    if journal is not None:
        journal.open()
    try:
        for sink in sinks:
            sink.open(context)
        try:
            for path in files:
                result.files += 1
                bad: list[int] = []
                batch = []
                for event in read_events(path, bad):
                    if runs and event.get("run") not in runs:
                        continue
                    batch.append(from_journal(event))
                    if len(batch) >= BATCH:
                        result.new += _write(target, sinks, batch)
                        result.events += len(batch)
                        batch = []
                if batch:
                    result.new += _write(target, sinks, batch)
                    result.events += len(batch)
                if bad:
                    log.warning("%s: skipped %d lines that are not valid events (first at line %d; "
                                "--log-level debug says why for each)", path, len(bad), bad[0])
                    result.bad_lines += len(bad)
            for sink in sinks:
                sink.flush()
            if target is not None and target.refused:
                log.warning("the journal refused %d events", target.refused)
                result.bad_lines += target.refused
        finally:
            for sink in sinks:
                sink.close()
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


def _write(target: _JournalTarget | None, sinks: list[Sink], batch: list[dict]) -> int:
    """Write ``batch`` to the journal target first, then to each sink; the events new to the journal."""
    new = target.write(batch) if target is not None else 0
    for sink in sinks:
        sink.write(batch)
    return new
