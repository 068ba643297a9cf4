"""Reading the journal: the one way every reader takes its lines (docs/jsonl.md: "Reading it" says
which reader serves whom, "Lines that are not events" why every line is checked with
``parse_event``).

Every reader that hands events to a sink restores non-finite metrics
(``sinks.events.from_journal``), so a live sink and a replayed one see the same. The writer
(relay/journal/journal.py) never pays for the check: it writes only events validated on arrival.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from relay.wire import schema
from relay.wire.lines import event_error, parse_event, parse_line
from sinks.events import from_journal

log = logging.getLogger(__name__)

READ_SIZE = 1 << 20


def journal_files(path: Path) -> list[Path]:
    """The JSONL files a journal path stands for: the file itself, or every run file in a
    directory."""
    # (names listed and sorted as strings: Path globbing and comparing cost thousands of runs 0.3 s)
    if path.is_dir():
        with os.scandir(path) as entries:
            names = sorted(e.name for e in entries
                           if e.name.endswith(".jsonl") and not e.name.startswith("_"))
        return [path / name for name in names]
    return [path]


def open_listed(path: Path) -> BinaryIO | None:
    """``path`` opened for reading, or None where it went since it was listed (or is no file);
    the caller closes it (``with``)."""
    try:
        return open(path, "rb")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def is_directory_layout(path: str | os.PathLike[str]) -> bool:
    """A path that exists as a directory or ends with a slash gets one file per run."""
    return os.fspath(path).endswith(os.sep) or Path(path).is_dir()


def read_events(path: Path, bad_lines: list[int] | None = None, whole_lines: bool = False,
                read_bytes: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """Events of one JSONL file in file order, as written; lines that are not events (unparsable,
    or see ``event_error``) are skipped and their line numbers appended to ``bad_lines`` so callers
    can report them (each also logged at debug level, with why). ``whole_lines``: a last line
    without its newline (torn, or still being written) is left out. ``read_bytes``: its one item
    grows by each line's bytes as it is read (a caller that shows how far it got)."""
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if read_bytes is not None:
                read_bytes[0] += len(line)
            if not line.strip() or (whole_lines and not line.endswith(b"\n")):
                continue
            event = parse_line(line)
            error = "not a JSON object" if event is None else event_error(event)
            if event is not None and error is None:
                yield event
                continue
            if bad_lines is not None:
                bad_lines.append(number)
            log.debug("%s:%d is not an event, skipped: %.200s", path, number, error)


class LineDecoder:
    """Journal lines arriving in pieces (a pipe) -> events of the complete ones, restored as a sink
    gets them; a partial last line waits for the rest. ``bad_lines`` counts what was not an
    event."""

    def __init__(self) -> None:
        self.bad_lines = 0
        self._rest = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        *lines, self._rest = (self._rest + data).split(b"\n")
        events = []
        for line in lines:
            event = parse_event(line)
            if event is not None:
                events.append(from_journal(event))
            elif line.strip():
                self.bad_lines += 1
        return events


class JournalReader:
    """Reads a journal (file or directory) incrementally: each ``read(run)`` yields the events of
    the complete lines written since the previous ``read`` for the same ``run`` (None: every run),
    in file order, remembering a byte offset per (file, run). In the directory layout a run's read
    opens only that run's file, and new run files are found as they appear. ``restore`` turns
    non-finite metric strings back into floats (what a sink gets). (``relay tail`` follows files
    with ``relay.cli.follow.Follower`` instead: it shows the lines as written, also those that are
    not events, and notices a file replaced.)"""

    def __init__(self, path: str | Path, *, directory: bool | None = None,
                 restore: bool = True) -> None:
        self.path = Path(path)
        self.directory = is_directory_layout(path) if directory is None else directory
        self.restore = restore
        self.bad_lines = 0
        self._offsets: dict[tuple[str, str | None], int] = {}

    def __call__(self, run: str) -> Iterator[dict[str, Any]]:
        return self.read(run)

    def files(self, run: str | None = None) -> list[Path]:
        if not self.directory:
            return [self.path]
        if run is not None:  # a run id that cannot name a file has none (and names none outside)
            return [self.path / f"{run}.jsonl"] if schema.valid_run_id(run) else []
        return journal_files(self.path) if self.path.is_dir() else []

    def read(self, run: str | None = None) -> Iterator[dict[str, Any]]:
        for path in self.files(run):
            for line in self._lines(path, run):
                event = parse_event(line)
                if event is None:
                    self.bad_lines += 1
                elif run is None or event["run"] == run:
                    yield from_journal(event) if self.restore else event

    def lines(self, run: str | None = None) -> Iterator[bytes]:
        """The complete, non-blank lines written since the previous call (of ``read`` or ``lines``)
        for ``run``, as written and unchecked: for a reader that applies the rules itself
        (relay/forward/sender.py). In the directory layout a run's file may hold a line of another
        run."""
        for path in self.files(run):
            yield from self._lines(path, run)

    def next_lines(self, run: str | None, limit: int) -> list[bytes]:
        """Up to ``limit`` of the lines ``lines(run)`` would yield next, read a block at a time: for
        a reader that takes thousands at once (relay/forward/sender.py). The reader's place moves
        past exactly the lines returned (and any blank line among them)."""
        out: list[bytes] = []
        for path in self.files(run):
            if len(out) >= limit:
                break
            key = (str(path), run)
            offset = self._offsets.get(key, 0)
            fh = open_listed(path)
            if fh is None:
                continue
            with fh:
                if os.fstat(fh.fileno()).st_size < offset:
                    offset = 0  # replaced by a shorter file: read it afresh
                fh.seek(offset)
                while len(out) < limit:
                    block = _complete_lines(fh)
                    if not block:
                        break
                    lines = block.split(b"\n")
                    lines.pop()
                    room = limit - len(out)
                    if len(lines) > room:
                        lines = lines[:room]
                        offset += sum(map(len, lines)) + room
                        fh.seek(offset)
                    else:
                        offset += len(block)
                    out += filter(bytes.strip, lines)
            self._offsets[key] = offset
        return out

    def position(self, path: Path, run: str | None = None) -> int:
        """Where the next ``lines(run)`` starts reading ``path``: the byte offset after the last
        line yielded (a reader that cuts the lines into byte ranges, as relay/fleet does, reads it
        per line)."""
        return self._offsets.get((str(path), run), 0)

    def seek(self, path: Path, run: str | None, offset: int) -> None:
        """Resume ``path``'s reading for ``run`` at ``offset``, the end of a line (a saved
        position)."""
        self._offsets[(str(path), run)] = offset

    def _lines(self, path: Path, run: str | None) -> Iterator[bytes]:
        key = (str(path), run)  # a str: hashing a Path per line costs more than reading the line
        offset = self._offsets.get(key, 0)
        fh = open_listed(path)
        if fh is None:
            return
        offsets = self._offsets
        with fh:
            if os.fstat(fh.fileno()).st_size < offset:  # replaced by a shorter file: read it afresh
                offset = 0
            fh.seek(offset)
            pending = b""
            while True:
                chunk = fh.read(READ_SIZE)
                if not chunk:
                    return
                pending += chunk
                end = pending.rfind(b"\n") + 1
                if not end:
                    continue  # a line longer than READ_SIZE, or a partial last line
                lines = pending[:end].split(b"\n")
                pending = pending[end:]
                lines.pop()
                for line in lines:
                    offset += len(line) + 1
                    if line.strip():
                        # before yielding: a reader that stops keeps its place
                        offsets[key] = offset
                        yield line
                offsets[key] = offset


def _complete_lines(fh: Any) -> bytes:
    """The complete lines of ``fh`` from where it stands, READ_SIZE bytes or so (a longer first line
    whole), leaving ``fh`` after them; empty when no complete line is there (yet)."""
    start = fh.tell()
    block = fh.read(READ_SIZE)
    end = block.rfind(b"\n") + 1
    # a first line longer than READ_SIZE: read on to its end
    while not end and len(block) >= READ_SIZE:
        more = fh.read(READ_SIZE)
        if not more:
            break
        block += more
        end = block.rfind(b"\n") + 1
    fh.seek(start + end)
    return block[:end]
