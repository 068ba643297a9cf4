"""A sink's catch-up from the journal: the one place that reads the journal back into a sink
(docs/relay.md, "Catch-up from the journal").

A *pass* reads the recent journal from where the previous one stopped (its state file keeps, per
file, the size up to which every event was delivered); a *run's read* (``run_batches``) keeps its
place in memory only, since the hole that asked for it is in the sink's saved spans.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from relay.journal.journal import Journal
from relay.journal.reader import journal_files
from relay.wire.lines import parse_event
from sinks.events import from_journal
from sinks.files import write_atomic

log = logging.getLogger(__name__)

MAX_AGE = 3 * 24 * 3600.0  # seconds since a journal file was last written
MAX_FILES = 100  # run files (directory layout) read per pass, newest first
BATCH = 2000  # events per write() call
READ_SIZE = 1 << 20


class CatchUp:
    """The journal files a pass reads, their events in batches, and how far each was delivered."""

    def __init__(self, journal: str, sink: str, max_age: float = MAX_AGE,
                 max_files: int = MAX_FILES) -> None:
        self.journal = Journal(journal)
        self.state_path = self.journal.sidecar(f"_catchup_{sink}.json")
        self.max_age = max_age
        self.max_files = max_files
        self.done = _load(self.state_path)
        self.reader = self.journal.reader()

    def run_batches(self, run: str) -> Iterator[list[dict[str, Any]]]:
        """Batches of ``run``'s events written since the previous call for it (the first: all of
        them)."""
        batch: list[dict[str, Any]] = []
        for event in self.reader.read(run):
            batch.append(event)
            if len(batch) >= BATCH:
                yield batch
                batch = []
        yield batch

    def due(self) -> list[tuple[Path, int, int]]:
        """(file, offset, size) of every recent file with bytes beyond what an earlier pass
        delivered."""
        now = time.time()
        recent = []
        for path in journal_files(self.journal.path):
            try:
                st = path.stat()
            except OSError:  # gone meanwhile, or no journal yet
                continue
            if now - st.st_mtime <= self.max_age:
                recent.append((st.st_mtime, path, st.st_size))
        recent.sort(reverse=True)
        out = []
        for _, path, size in recent[:self.max_files]:
            start = self.done.get(path.name, 0)
            if start > size:  # replaced by a shorter file: read it afresh
                start = 0
            if size > start:
                out.append((path, start, size))
        return out

    def read(self, path: Path, start: int, size: int) -> Iterator[tuple[list[dict[str, Any]], int]]:
        """Batches of the events on the complete lines of ``path`` between ``start`` and ``size``,
        each with the offset just past its last line (what ``delivered`` is then told)."""
        batch: list[dict[str, Any]] = []
        offset = start
        with open(path, "rb") as fh:
            fh.seek(start)
            pending = b""
            while offset + len(pending) < size:
                chunk = fh.read(min(READ_SIZE, size - offset - len(pending)))
                if not chunk:
                    break
                pending += chunk
                end = pending.rfind(b"\n") + 1
                if not end:
                    continue
                for line in pending[:end].split(b"\n")[:-1]:
                    offset += len(line) + 1
                    event = parse_event(line) if line.strip() else None
                    # a line that is no event was counted by every other reader
                    if event is not None:
                        batch.append(from_journal(event))
                    if len(batch) >= BATCH:
                        yield batch, offset
                        batch = []
                pending = pending[end:]
        yield batch, offset

    def delivered(self, path: Path, offset: int) -> None:
        """Every event of ``path`` before ``offset`` reached the sink: the next pass starts
        there."""
        self.done[path.name] = offset
        try:
            write_atomic(self.state_path, json.dumps(self.done))
        except OSError as exc:  # the next pass reads more than it needs; nothing is lost
            log.warning("catch-up state %s not saved: %s", self.state_path, exc)


def _load(path: Path) -> dict[str, int]:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # unreadable: every recent file is read whole once more
        log.warning("catch-up state %s unreadable (%s); reading the recent journal whole",
                    path, exc)
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if type(v) is int and v >= 0}
