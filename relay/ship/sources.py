"""The journal as a shipper reads it: *sources*, each a run (directory layout) or None (one file),
with a place that moves as it is read and is set again from a saved position after a restart.

Which sources have news: the runs the relay said (``of``), and, since a notice can be lost with a
shipper's process, those whose file holds more than was read (``behind``).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from relay.journal.reader import JournalReader

Source = str | None


class JournalSources:
    """A journal (file or directory) read source by source, each from its own position."""

    def __init__(self, journal: Path) -> None:
        self.reader = JournalReader(journal, restore=False)
        self.path = self.reader.path
        self.directory = self.reader.directory

    def sources(self) -> Iterator[tuple[Source, Path]]:
        """Every source with its file."""
        if not self.directory:
            yield None, self.path
            return
        for path in self.reader.files():
            yield path.stem, path

    def of(self, runs: Iterable[str]) -> set[Source]:
        """The sources that hold these runs' lines."""
        return set(runs) if self.directory else {None}

    def file(self, source: Source) -> Path | None:
        files = self.reader.files(source)
        return files[0] if files else None

    def size(self, source: Source) -> int | None:
        """The source's file's size now; None when it has none (yet, or any more)."""
        path = self.file(source)
        try:
            return None if path is None else path.stat().st_size
        except FileNotFoundError:
            return None

    def position(self, source: Source) -> int:
        path = self.file(source)
        return self.reader.position(path, source) if path else 0

    def seek(self, source: Source, offset: int) -> None:
        """Read ``source`` on from ``offset`` (the end of a line: a saved position)."""
        path = self.file(source)
        if path is not None:
            self.reader.seek(path, source, offset)

    def behind(self, source: Source) -> bool:
        """True when the source's file holds more than what was read of it."""
        size = self.size(source)
        return size is not None and size > self.position(source)

    def next_lines(self, source: Source, limit: int) -> list[bytes]:
        """Up to ``limit`` of the source's next complete, non-blank lines, as written; its place
        moves past them."""
        return self.reader.next_lines(source, limit)
