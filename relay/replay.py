"""Rebuild any sink from the JSONL journal: the journal is the source of truth, so a sink that
was down, added later or lost can be brought back to what it would have been live."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from relay.schema import from_journal
from sinks.base import Sink, SinkContext
from relay.dedupe import Dedupe
from sinks.jsonl import journal_files, read_events

log = logging.getLogger(__name__)

BATCH = 1000


@dataclass
class ReplayResult:
    files: int = 0
    events: int = 0
    bad_lines: int = 0


def replay_files(paths: Iterable[Path], sinks: list[Sink], runs: set[str] | None = None) -> ReplayResult:
    """Write every event of ``paths`` (files or journal directories) to ``sinks`` in file order.

    Non-finite metric values, stored as "NaN"/"Infinity" strings, become floats again. Sinks are
    expected to be idempotent, so replaying twice adds nothing.
    """
    result = ReplayResult()
    files = [f for p in paths for f in journal_files(Path(p))]
    context = SinkContext(journal=files[0] if len(files) == 1 else None)
    for sink in sinks:
        sink.open(context)
    targets = [_Target(sink) for sink in sinks]
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
                    _write(targets, batch)
                    result.events += len(batch)
                    batch = []
            if batch:
                _write(targets, batch)
                result.events += len(batch)
            if bad:
                log.warning("%s: skipped %d unreadable lines (first at line %d)", path, len(bad), bad[0])
                result.bad_lines += len(bad)
        for sink in sinks:
            sink.flush()
    finally:
        for sink in sinks:
            sink.close()
    return result


class _Target:
    """One sink being replayed into; a durable sink (a JSONL journal) is fed only what it lacks."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.dedupe = Dedupe() if sink.durable else None

    def write(self, batch: list[dict]) -> None:
        if self.dedupe is None:
            self.sink.write(batch)
            return
        fresh = [e for e in batch if self._take(e)]
        if fresh:
            self.sink.write(fresh)

    def _take(self, event: dict) -> bool:
        assert self.dedupe is not None
        return self.dedupe.lookup(event.get("run"), event.get("rank"), self.sink).take(event.get("seq", -1))


def _write(targets: list[_Target], batch: list[dict]) -> None:
    for target in targets:
        target.write(batch)
