"""The JSONL sink: the relay's journal and the source of truth (docs/jsonl.md).

One JSON object per event per line, written with a single append per batch so readers never see
half a line; a torn tail left by a crash is cut back to the last newline on open (those events
were never acknowledged, so their clients resend them). The relay acknowledges events only after
this sink flushed them, and after a restart it asks ``seen()`` what is already here, so nothing
is written twice.
"""
from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import click
import orjson

from relay.schema import json_safe
from sinks.base import Sink, SinkContext, SinkError

log = logging.getLogger(__name__)

DEFAULT_PATH = "relay-logs/"
LOCK_NAME = "_relay.lock"
#: Run files kept open at once in the directory layout; the least recently written is closed first,
#: so thousands of run ids cost descriptors for only the active few.
MAX_OPEN_FILES = 128
MAX_RELEASED = 4096  # forgotten runs of a shared file remembered before its index is dropped whole


def encode_line(event: dict[str, Any]) -> bytes:
    """One event as one JSON line; non-finite floats become "NaN"/"Infinity"/"-Infinity"."""
    line = orjson.dumps(event, default=str, option=orjson.OPT_APPEND_NEWLINE)
    if b"null" in line:  # orjson writes NaN/inf as null; only then pay for the walk
        line = orjson.dumps(json_safe(event), default=str, option=orjson.OPT_APPEND_NEWLINE)
    return line


def encode_lines(events: list[dict[str, Any]]) -> bytes:
    """encode_line for a batch of events, joined: one scan for non-finite floats instead of one per event."""
    chunk = b"".join([orjson.dumps(e, default=str, option=orjson.OPT_APPEND_NEWLINE) for e in events])
    if b"null" in chunk:
        return b"".join([encode_line(e) for e in events])
    return chunk


def read_events(path: Path, bad_lines: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """Events of one JSONL file in file order; unparsable lines are skipped and their line
    numbers appended to ``bad_lines`` so callers can report them."""
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                if bad_lines is not None:
                    bad_lines.append(number)
                continue
            if type(event) is dict:
                yield event
            elif bad_lines is not None:
                bad_lines.append(number)


def journal_files(path: Path) -> list[Path]:
    """The JSONL files a journal path stands for: the file itself, or every run file in a directory."""
    if path.is_dir():
        return sorted(p for p in path.glob("*.jsonl") if not p.name.startswith("_"))
    return [path]


def is_directory_layout(path: str | Path) -> bool:
    """A path that exists as a directory or ends with a slash gets one file per run."""
    return str(path).endswith(os.sep) or Path(path).is_dir()


class JsonlSink(Sink):
    """Default sink and journal: a single file for all runs, or a directory of ``<run>.jsonl``."""

    name = "jsonl"
    durable = True

    @classmethod
    def options(cls) -> list[click.Option]:
        return [
            click.Option(["--path"], default=DEFAULT_PATH, show_default=True,
                         help="JSONL output: a file for every run, or a directory (existing, or ending "
                              "in '/') holding one <run>.jsonl per run."),
            click.Option(["--fsync/--no-fsync"], default=False, show_default=True,
                         help="fsync the journal before acknowledging (survives power loss, costs latency)."),
        ]

    def __init__(self, path: str | os.PathLike = DEFAULT_PATH, fsync: bool = False) -> None:
        self.directory = is_directory_layout(path)
        self.path = Path(path)
        self.fsync = fsync
        self._fds: dict[str, int] = {}  # in order of use: the first is the least recently written
        self._cut: set[str] = set()  # files whose torn tail was already cut in this process
        self._dirty: set[int] = set()
        self._lock_fd: int | None = None
        self._index: dict[str, dict[int, list[list[int]]]] | None = None
        self._released: set[str] = set()

    # -- paths beside the journal ---------------------------------------------------------------

    def sidecar(self, suffix: str) -> Path:
        """A file next to the journal (dead letters, stats), named so it never clashes with a run."""
        if self.directory:
            return self.path / f"_relay{suffix}"
        return self.path.with_name(self.path.name.removesuffix(".jsonl") + suffix)

    def file_for(self, run: str) -> Path:
        return self.path / f"{run}.jsonl" if self.directory else self.path

    # -- Sink ------------------------------------------------------------------------------------

    def open(self, context: SinkContext) -> None:
        folder = self.path if self.directory else self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            lock_path = self.path / LOCK_NAME if self.directory else self.sidecar(".lock")
            self._lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SinkError(f"cannot write the JSONL journal at {self.path}: {exc.strerror}; "
                            "choose a writable --path") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise SinkError(f"another relay is already writing {self.path}; stop it or choose another --path") from None
        if not self.directory:
            self._fd(None)

    def write(self, events: Sequence[dict[str, Any]]) -> None:
        self.write_lines([(e["run"], encode_line(e)) for e in events])

    def write_lines(self, lines: list[tuple[str, bytes]]) -> None:
        """Append (run, lines) pairs, each one or more encoded lines of one run (encode_line,
        encode_lines), with one write per file: the relay encodes lines as their events arrive,
        while the events are still in the CPU's cache.

        All or nothing per file: a failed append is cut back off, and when this raises, ``lines``
        keeps only the pairs not yet written, so a retry writes nothing twice."""
        if not self.directory:
            self._append(self._fd(None), b"".join([line for _, line in lines]))
            return
        per_run: dict[str, list[bytes]] = {}
        for run, line in lines:
            per_run.setdefault(run, []).append(line)
        done: set[str] = set()
        try:
            for run, chunk in per_run.items():
                self._append(self._fd(run), b"".join(chunk))
                done.add(run)
        except Exception:
            lines[:] = [pair for pair in lines if pair[0] not in done]
            raise

    def flush(self) -> None:
        if self.fsync:
            for fd in self._dirty:
                os.fsync(fd)
        self._dirty.clear()

    def release(self, run: str) -> None:
        """The relay forgot an idle run: close its file, and rescan if it ever comes back."""
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
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def seen(self, run: str) -> Iterable[tuple[int, int]]:
        if self.directory:
            index = _scan([self.file_for(run)])
        elif self._index is None or run in self._released:
            index = _scan([self.path])  # one pass over the shared file serves every new run
            self._released.discard(run)
            if self._index is None:
                self._index = index
        else:
            index = self._index
        for rank, spans in index.pop(run, {}).items():
            for start, end in spans:
                for seq in range(start, end):
                    yield rank, seq

    # -- internals ---------------------------------------------------------------------------------

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
                raise SinkError(f"cannot write {path}: {exc.strerror}; choose a writable --path") from None
            if key not in self._cut:
                _cut_torn_tail(fd, path)
                self._cut.add(key)
        fds[key] = fd  # (re)inserted last: the most recently used
        return fd

    def _close_fd(self, key: str) -> None:
        fd = self._fds.pop(key, None)
        if fd is None:
            return
        if fd in self._dirty:
            self._dirty.discard(fd)
            if self.fsync:
                os.fsync(fd)
        os.close(fd)

    def _append(self, fd: int, blob: bytes) -> None:
        start = os.lseek(fd, 0, os.SEEK_END)
        view = memoryview(blob)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            os.ftruncate(fd, start)  # never leave half a batch (or half a line) behind
            raise
        self._dirty.add(fd)


def _cut_torn_tail(fd: int, path: Path) -> None:
    """A crash mid-write can leave half a line; cut it so every line stays valid JSON."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    tail = os.pread(fd, min(size, 1 << 20), max(0, size - (1 << 20)))
    if tail.endswith(b"\n"):
        return
    cut = tail.rfind(b"\n")
    keep = size - len(tail) + cut + 1 if cut >= 0 else 0
    os.ftruncate(fd, keep)
    log.warning("cut a torn last line (%d bytes) from %s; its events were never acknowledged and "
                "will be resent", size - keep, path)


def _scan(paths: Iterable[Path]) -> dict[str, dict[int, list[list[int]]]]:
    """run -> rank -> contiguous [start, end) seq spans of the events already in these files."""
    index: dict[str, dict[int, list[list[int]]]] = {}
    for path in paths:
        if not path.exists():
            continue
        for event in read_events(path):
            try:
                run, rank, seq = event["run"], int(event["rank"]), int(event["seq"])
            except (KeyError, TypeError, ValueError):
                continue
            spans = index.setdefault(run, {}).setdefault(rank, [])
            if spans and spans[-1][1] == seq:
                spans[-1][1] = seq + 1
            else:
                spans.append([seq, seq + 1])
    return index
