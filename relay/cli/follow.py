"""Following a journal path the way ``tail -F`` follows a name: the raw complete lines written since
the last look (docs/relay.md, "Watching a journal: relay tail").

Not ``relay.journal.reader.JournalReader``: that one parses events and keeps offsets by name, as a
sink catching up needs, while a viewer needs the raw bytes and must notice a file replaced under the
same name. A file truncated and written past its old length between two looks is not noticed (``tail
-F`` has the same blind spot); a journal is only appended to, so that takes a hand edit.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

from relay.cli.backward import Identity
from relay.journal.reader import READ_SIZE, journal_files
from relay.journal.recovery import end_of_last_line

#: Files kept open at once; past it a file is let go once read, and reopened by name (and
#: identity) when it grows, so a directory of thousands of runs costs few descriptors.
MAX_OPEN = 64
#: Seconds since its last write after which a file is taken to hold no line being written.
WRITTEN_S = 60.0
#: Looks in a row with nothing new after which a file is let go once half of MAX_OPEN are open
#: (five seconds of -f), so the files still written to keep theirs.
QUIET_LOOKS = 25


class Ending(NamedTuple):
    """Where a file's lines end when a follower started at its end, which file that was, and when it
    was last written (a reader of many files opens the newest first: relay/cli/backlog.py)."""

    path: Path
    end: int
    identity: Identity
    mtime: float


@dataclass
class _File:
    identity: Identity  # (st_dev, st_ino) of the file we read
    offset: int = 0  # bytes of it consumed as complete lines
    pending: bytes = b""  # a last line without its newline yet
    fh: BinaryIO | None = None
    quiet: int = 0  # looks in a row that found nothing new
    lines: list[bytes] = field(default_factory=list)


class Follower:
    """``poll()`` returns the complete lines (bytes ending in a newline) written since the previous
    call, file by file; ``poll(final=True)`` also a last line that lacks its newline (a one-shot
    read). ``notice`` gets one-line remarks for the user (a file truncated or replaced)."""

    def __init__(self, path: Path, notice: Callable[[str], None] = lambda _: None) -> None:
        self.path = path
        self.notice = notice
        self._files: dict[Path, _File] = {}
        self._open = 0

    def skip_to_end(self, final: bool = False) -> list[Ending]:
        """Take each file as read up to its end without reading it, and say where that is, for a
        caller that shows the end of what is there by reading it backwards (relay/cli/backward.py).
        The end is that of the last complete line, so ``poll`` gives a line still being written once
        it is whole; a file not written for WRITTEN_S is taken to end with its last line, and is not
        opened (a directory of thousands of finished runs). ``final`` (a one-shot read, no poll
        after it): each file's very end, from its size alone, no file opened."""
        out, now = [], time.time()
        for name in self._names():
            try:
                stat = os.stat(name)
                quiet = now - stat.st_mtime > WRITTEN_S
                # (no with: a handle kept open across polls in _files, closed by _close)
                fh = None if final or quiet else open(name, "rb")  # noqa: SIM115
            except OSError:  # gone between the listing and now: the next poll sees what happened
                continue
            opened = os.fstat(fh.fileno()) if fh is not None else stat
            if fh is not None and (opened.st_dev, opened.st_ino) != (stat.st_dev, stat.st_ino):
                # replaced since the stat: the next poll reads the new file from its start
                fh.close()
                continue
            end = stat.st_size if fh is None else end_of_last_line(fh.fileno(), stat.st_size)
            out.append(Ending(name, end, (stat.st_dev, stat.st_ino), stat.st_mtime))
            if final:
                continue
            if fh is None:  # not written lately: no line being written; opened again once it grows
                self._files[name] = _File((stat.st_dev, stat.st_ino), offset=end, quiet=1)
                continue
            fh.seek(end)
            state = self._files[name] = _File((stat.st_dev, stat.st_ino), offset=end, fh=fh)
            self._open += 1
            # kept open, so a file renamed away is still read to its end
            if self._open > MAX_OPEN // 2:
                self._close(state)
                state.quiet = 1  # closed: opened again by name only once it grows
        return out

    def poll(self, final: bool = False) -> list[tuple[Path, list[bytes]]]:
        names = self._names()
        out = []
        # a run file removed: what it still held, then forget it
        for gone in set(self._files).difference(names):
            state = self._files.pop(gone)
            self._drain(state)
            self._close(state)
            self.notice(f"{gone} went away; following the name, from the start of any new file")
            if state.lines:
                out.append((gone, state.lines))
        for name in names:
            lines = self._look(name, final)
            if lines:
                out.append((name, lines))
        return out

    def close(self) -> None:
        for state in self._files.values():
            self._close(state)

    def _names(self) -> list[Path]:
        if self.path.is_dir():
            return journal_files(self.path)
        return [self.path] if self.path.exists() else []

    def _look(self, name: Path, final: bool) -> list[bytes]:
        try:
            stat = os.stat(name)
        except OSError:  # gone between the listing and now; the next look sees what happened
            return []
        identity = (stat.st_dev, stat.st_ino)
        state = self._files.get(name)
        if state is None:
            state = self._files[name] = _File(identity)
        elif state.identity != identity:  # replaced: what the old file still held, then the new one
            self._drain(state)
            self._close(state)
            old = state.lines
            state = self._files[name] = _File(identity, lines=old)
            self.notice(f"{name} was replaced; following the new file from its start")
        if state.fh is None:
            if stat.st_size == state.offset and state.quiet:
                state.quiet += 1  # closed and unchanged: not worth opening
                return self._take(state, final)
            try:
                state.fh = open(name, "rb")  # noqa: SIM115 (kept open across polls, see _close)
            except OSError:
                return []
            self._open += 1
            opened = os.fstat(state.fh.fileno())
            if (opened.st_dev, opened.st_ino) != identity:
                self._close(state)  # replaced again since the stat: the next look takes it
                return []
            state.fh.seek(state.offset)
        self._drain(state)
        if self._open > MAX_OPEN or (state.quiet >= QUIET_LOOKS and self._open > MAX_OPEN // 2):
            self._close(state)
        return self._take(state, final)

    def _drain(self, state: _File) -> None:
        """Read what the open file holds past our offset (a renamed file too, until it is let
        go)."""
        fh = state.fh
        if fh is None:
            return
        if os.fstat(fh.fileno()).st_size < state.offset:
            fh.seek(0)
            state.offset, state.pending = 0, b""
            self.notice(f"{fh.name} was truncated; reading it again from its start")
        grew = False
        while True:
            chunk = fh.read(READ_SIZE)
            if not chunk:
                break
            grew = True
            data = state.pending + chunk
            end = data.rfind(b"\n") + 1
            if end:  # split at newlines only: a stray "\r" stays inside its line, byte for byte
                state.lines.extend(line + b"\n" for line in data[:end - 1].split(b"\n"))
                state.offset += end
                state.pending = data[end:]
            else:
                state.pending = data
        state.quiet = 0 if grew else state.quiet + 1

    @staticmethod
    def _take(state: _File, final: bool) -> list[bytes]:
        lines, state.lines = state.lines, []
        if final and state.pending:
            lines.append(state.pending)
            state.offset += len(state.pending)
            state.pending = b""
        return lines

    def _close(self, state: _File) -> None:
        """Let the file go; a partial last line is read again from ``offset`` if it is reopened."""
        if state.fh is not None:
            state.fh.close()
            state.fh = None
            self._open -= 1
        state.pending = b""
