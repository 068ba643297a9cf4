"""Writing the journal: the relay's JSONL source of truth (docs/jsonl.md: line-atomic appends, a
torn tail cut back to the last newline, bounded lines); reading it is relay/journal/reader.py.

``Journal`` is owned by the daemon, which acknowledges events only after ``flush()`` and after a
restart asks ``seen()`` what is already here, so nothing is written twice. The journal is not a
sink: the relay writes it itself, before it acknowledges anything. What it cannot do is a
``JournalError``, one line that says what to do (the command line exits 2 with it).
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from relay.journal.dedupe import claimed_drop
from relay.journal.reader import JournalReader, is_directory_layout, read_events
from relay.journal.recovery import cut_torn_tail
from relay.wire import schema
from relay.wire.lines import encode_line, parse_event
from sinks.events import RELAY_RANK, from_journal

log = logging.getLogger(__name__)

#: What the command line (``--sink jsonl``), the relay's stats and its log lines call the journal.
NAME = "jsonl"
DEFAULT_PATH = "relay-logs/"
LOCK_NAME = "_relay.lock"
#: Run files kept open at once in the directory layout; the least recently written is closed first,
#: so thousands of run ids cost descriptors for only the active few.
MAX_OPEN_FILES = 128
MAX_RELEASED = 4096  # forgotten runs of a shared file remembered before its index is dropped whole
RECENT_BYTES = 1 << 20  # what Journal.recent reads back from the end of a run's file
IOV_MAX = os.sysconf("SC_IOV_MAX")  # buffers one writev() takes
#: The relay's own lifecycle events that say who may write a stream (kept in ``Seen.said``).
WRITER_EVENTS = ("conflict", "conflict_ended")


class JournalError(Exception):
    """The journal cannot be opened or written here (a folder not writable, another relay's lock):
    one line saying what is wrong and what to do."""


class PartialWrite(JournalError):
    """A journal write that failed part way (``Journal.write_lines``): ``written``, the (run, lines)
    pairs that are in the journal, in their order; ``left``, those that are not. Like
    ``BlockingIOError.characters_written``, it says how far the write went."""

    def __init__(self, cause: Exception, written: list[tuple[str, bytes]],
                 left: list[tuple[str, bytes]]) -> None:
        super().__init__(str(cause))
        self.written = written
        self.left = left


class BadRunId(schema.FrameError):
    """A run id the journal cannot name a file after: a ValueError (and a FrameError, reason
    ``bad_run``) that callers count; the journal creates no file for it."""


class Journal:
    """The journal the daemon writes: a single file for all runs, or a directory of
    ``<run>.jsonl``."""

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_PATH, fsync: bool = False) -> None:
        self.directory = is_directory_layout(path)
        self.path = Path(path)
        self.fsync = fsync
        self._fds: dict[str, int] = {}  # in order of use: the first is the least recently written
        self._cut: set[str] = set()  # files whose torn tail was already cut in this process
        self._dirty: set[int] = set()
        self._lock_fd: int | None = None
        self._lock_path = Path()
        # created by open(), removed by abandon() if still empty
        self._made_folder: Path | None = None
        self._index: dict[str, dict[int, Seen]] | None = None
        self._released: set[str] = set()
        self.ends: dict[str, int] = {}  # run -> where its file ended after the last write of it

    def sidecar(self, suffix: str) -> Path:
        """A file next to the journal (dead letters, stats), named so it never clashes with a
        run."""
        if self.directory:
            return self.path / f"_relay{suffix}"
        return self.path.with_name(self.path.name.removesuffix(".jsonl") + suffix)

    def file_for(self, run: str) -> Path:
        """The file ``run``'s events go to; BadRunId (never a path) for a run id that cannot name
        one. The readers hand on valid run ids only, and the relay validated them on arrival."""
        if not self.directory:
            return self.path
        if not schema.valid_run_id(run):
            raise BadRunId("bad_run", f"run id {str(run)[:64]!r} cannot name a journal file "
                                      f"(it must match {schema.RUN_ID_RE.pattern})")
        return self.path / f"{run}.jsonl"

    def reader(self, restore: bool = True) -> JournalReader:
        """A reader of this journal, from its start."""
        return JournalReader(self.path, directory=self.directory, restore=restore)

    def open(self) -> None:
        """Create the folder and take the lock; JournalError if either cannot be."""
        folder = self.path if self.directory else self.path.parent
        self._made_folder = None if folder.exists() else folder
        lock_path = self.path / LOCK_NAME if self.directory else self.sidecar(".lock")
        while self._lock_fd is None:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise JournalError(f"cannot write the JSONL journal at {self.path}: "
                                   f"{exc.strerror}; choose a writable --path") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise JournalError(f"another relay is already writing {self.path}; "
                                   "stop it or choose another --path") from None
            if _same_file(fd, lock_path):
                self._lock_fd, self._lock_path = fd, lock_path
            else:  # the relay that held it removed it as we opened it (close): take the new one
                os.close(fd)
        if not self.directory:
            self._fd(None)

    def write(self, events: Sequence[dict[str, Any]]) -> None:
        """Append events (``relay replay``); the relay itself appends lines it encoded on
        arrival."""
        self.write_lines([(e["run"], encode_line(e)) for e in events])

    def write_lines(self, lines: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """Append (run, lines) pairs, each one or more encoded lines of one run (encode_line,
        encode_lines), with one write per file, and return the pairs written (all of them): the
        relay encodes lines as their events arrive, while the events are still in the CPU's cache.

        All or nothing per file: a failed append is cut back off, and the other files are still
        written. When a file fails, PartialWrite says which pairs did go in and which did not, so
        the caller hands on exactly what the journal holds and retries the rest without writing
        anything twice. ``ends`` then says, for each run written, where its file ends: what the
        followers of the journal learn (relay/sinkhost/notices.py)."""
        if not self.directory:
            try:
                end = self._append(self._fd(None), [line for _, line in lines])
            except Exception as exc:  # raised on, saying that nothing went in
                raise PartialWrite(exc, [], lines) from exc
            self.ends.update(dict.fromkeys([run for run, _ in lines], end))
            return lines
        per_run: dict[str, list[bytes]] = {}
        for run, line in lines:
            per_run.setdefault(run, []).append(line)
        failed: dict[str, Exception] = {}
        for run, chunk in per_run.items():
            try:
                self.ends[run] = self._append(self._fd(run), chunk)
            except Exception as exc:  # broad: raised below in PartialWrite, which says how far
                failed[run] = exc
        if failed:
            first = next(iter(failed.values()))
            raise PartialWrite(first, [pair for pair in lines if pair[0] not in failed],
                               [pair for pair in lines if pair[0] in failed]) from first
        return lines

    def flush(self) -> None:
        if self.fsync:
            for fd in self._dirty:
                os.fsync(fd)
        self._dirty.clear()

    def release(self, run: str) -> None:
        """The relay forgot an idle run: close its file, and rescan if it ever comes back."""
        self.ends.pop(run, None)
        if self.directory:
            self._close_fd(run)
            self._cut.discard(run)
        elif len(self._released) < MAX_RELEASED:
            self._released.add(run)
        else:  # a shared file: rescanning it once serves every run that comes back
            self._index, self._released = None, set()

    def close(self) -> None:
        self.flush()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        # removed while still held, so no relay that opens it now takes it
        if self._lock_fd is not None:
            with contextlib.suppress(FileNotFoundError):  # the folder removed by hand meanwhile
                os.unlink(self._lock_path)
            os.close(self._lock_fd)
            self._lock_fd = None

    def abandon(self) -> None:
        """Close a journal that never served (a sink failed to open beside it), leaving nothing
        behind: no lock file, and no folder that open() made and nothing filled."""
        self.close()
        folder = self._made_folder
        if folder is not None and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()

    def seen(self, run: str) -> dict[int, Seen]:
        """What is already here for ``run``, per rank: a restarted relay (or a replay into this
        journal) recognises events written but never acknowledged, and the drops clients reported.
        Read from whole lines only: a torn tail is cut first, so the dedupe state never counts an
        event the cut removes."""
        if self.directory:
            path = self.file_for(run)
            self._cut_once(run, path)  # the dedupe state comes only from lines that stay
            index = _scan([path])
        elif self._index is None or run in self._released:
            self._cut_once("", self.path)  # (open() did, unless seen() comes first)
            index = _scan([self.path])  # one pass over the shared file serves every new run
            self._released.discard(run)
            if self._index is None:
                self._index = index
        else:
            index = self._index
        return index.pop(run, {})

    def recent(self, run: str, limit: int = RECENT_BYTES) -> list[dict[str, Any]]:
        """``run``'s events among the last ``limit`` bytes of its file, in order, as a sink gets
        them: what a restarted relay needs to go on deriving a run's cluster events
        (relay/daemon/cross_rank.py)."""
        path = self.file_for(run) if self.directory else self.path
        try:
            with open(path, "rb") as fh:
                start = max(0, os.fstat(fh.fileno()).st_size - limit)
                fh.seek(start)
                lines = fh.read(limit).split(b"\n")
        except FileNotFoundError:
            return []
        events = (parse_event(line) for line in lines[1 if start else 0:])  # the first may be cut
        return [from_journal(event) for event in events
                if event is not None and event["run"] == run]

    def _fd(self, run: str | None) -> int:
        key = run or ""
        fds = self._fds
        fd = fds.pop(key, None)
        if fd is None:
            while len(fds) >= MAX_OPEN_FILES:
                self._close_fd(next(iter(fds)))
            path = self.file_for(run) if run else self.path
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            except OSError as exc:
                raise JournalError(f"cannot write {path}: {exc.strerror}; "
                                   "choose a writable --path") from None
            if key not in self._cut:
                cut_torn_tail(fd, path)
                self._cut.add(key)
        fds[key] = fd  # (re)inserted last: the most recently used
        return fd

    def _cut_once(self, key: str, path: Path) -> None:
        """Cut ``path``'s torn tail before anything reads it (``seen``), unless this process did
        already; a file not there yet has none."""
        if key in self._cut:
            return
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            cut_torn_tail(fd, path)
        finally:
            os.close(fd)
        self._cut.add(key)

    def _close_fd(self, key: str) -> None:
        fd = self._fds.pop(key, None)
        if fd is None:
            return
        if fd in self._dirty:
            self._dirty.discard(fd)
            if self.fsync:
                os.fsync(fd)
        os.close(fd)

    def _append(self, fd: int, parts: list[bytes]) -> int:
        """``parts`` at the file's end, whole or not at all, in one system call where it can (no
        copy of them joined); the file's end after them."""
        start = os.lseek(fd, 0, os.SEEK_END)
        size = sum(map(len, parts))
        try:
            done = os.writev(fd, parts) if len(parts) <= IOV_MAX else 0
            if done < size:  # a short write, or too many parts for one call: the rest as one block
                view = memoryview(b"".join(parts))[done:]
                while view:
                    view = view[os.write(fd, view):]
        except OSError:
            os.ftruncate(fd, start)  # never leave half a batch (or half a line) behind
            raise
        self._dirty.add(fd)
        return start + size


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open ``fd`` is still the file at ``path``."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (opened.st_dev, opened.st_ino)


class Seen:
    """What a journal holds of one (run, rank): contiguous [start, end) seq ``spans``, how far its
    client said it dropped (``dropped``: the highest ``claimed_drop`` of its stats events, 0: none)
    and how many events it said it dropped (``reported``: the highest ``dropped`` count there);
    ``hello``: the data, host and seq of its latest hello, whose session writes it
    (relay/journal/writers.py); ``said`` (the relay's own rank only): the data of its ``conflict``
    and ``conflict_ended`` lifecycle events, in the order written (relay/fleet/sessions.py)."""

    __slots__ = ("spans", "dropped", "reported", "hello", "said")

    def __init__(self) -> None:
        self.spans: list[list[int]] = []
        self.dropped = 0
        self.reported = 0
        self.hello: tuple[Any, Any, int] | None = None
        self.said: list[dict[str, Any]] = []

    def take(self, event: dict[str, Any], seq: int) -> None:
        """One more of its events, read from the journal."""
        spans = self.spans
        if spans and spans[-1][1] == seq:
            spans[-1][1] = seq + 1
        else:
            spans.append([seq, seq + 1])
        if event["type"] == "hello" and (self.hello is None or seq > self.hello[2]):
            self.hello = (event["data"], event["host"], seq)
        elif event["type"] == "stats":
            self.dropped = max(self.dropped, claimed_drop(event) or 0)
            count = event["data"].get("dropped")
            if type(count) is int and count > self.reported:
                self.reported = count
        elif event["type"] == "lifecycle" and event["rank"] == RELAY_RANK \
                and event["data"].get("event") in WRITER_EVENTS:
            self.said.append(event["data"])

    def seqs(self) -> Iterator[int]:
        """Every seq the spans hold, in order (tests and the fuzzer compare them with whole
        lines)."""
        for start, end in self.spans:
            yield from range(start, end)


def _scan(paths: Iterable[Path]) -> dict[str, dict[int, Seen]]:
    """run -> rank -> what these files hold of it, read from whole lines only: a last line without
    its newline is not there (it is cut when the file is opened for writing, and its events were
    never acknowledged)."""
    index: dict[str, dict[int, Seen]] = {}
    for path in paths:
        if not path.exists():
            continue
        # events only: run, rank and seq are valid
        for event in read_events(path, whole_lines=True):
            run, rank, seq = event["run"], event["rank"], event["seq"]
            ranks = index.setdefault(run, {})
            seen = ranks.get(rank)
            if seen is None:
                seen = ranks[rank] = Seen()
            seen.take(event, seq)
    return index
