"""Reading a journal file from its end: its lines before an offset, last first, in blocks that grow
from a few lines to a MiB, so a viewer that shows the end of a journal (``relay tail -n``, ``relay
tail -f``, ``relay runs``) reads about what it shows, whatever the file's size.

Lines are split at newlines only (a stray ``\\r`` stays inside its line, as ``relay tail --json``
prints it) and come back without their newline; empty lines are left out."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

#: The first read at a file's end: a few lines (a directory of thousands of runs reads one each).
FIRST_BLOCK = 8 << 10
#: Each further read doubles, up to this.
MAX_BLOCK = 1 << 20

Identity = tuple[int, int]  # (st_dev, st_ino): which file a name stood for


def lines_backwards(path: Path, end: int | None = None, identity: Identity | None = None) -> Iterator[bytes]:
    """The lines of ``path`` before byte ``end`` (None: its size), last first. Nothing when the file
    is gone, or is no longer the one ``identity`` names (replaced since it was looked at)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        stat = os.fstat(fd)
        if identity is not None and (stat.st_dev, stat.st_ino) != identity:
            return
        pos = stat.st_size if end is None else min(end, stat.st_size)
        block, rest = FIRST_BLOCK, b""
        while pos > 0:
            size = min(block, pos)
            pos -= size
            lines = (os.pread(fd, size, pos) + rest).split(b"\n")
            rest = lines[0]  # the end of a line that began in an earlier block (or the file's first)
            for line in reversed(lines[1:]):
                if line:
                    yield line
            block = min(block * 2, MAX_BLOCK)
        if rest:
            yield rest
    finally:
        os.close(fd)


def end_of_last_line(fd: int, size: int) -> int:
    """The offset just after the last newline before ``size`` in the open file ``fd``: where the
    complete lines end and a line still being written begins (0: there is none)."""
    pos, block = size, FIRST_BLOCK
    while pos > 0:
        start = max(0, pos - block)
        found = os.pread(fd, pos - start, start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        pos, block = start, min(block * 2, MAX_BLOCK)
    return 0
