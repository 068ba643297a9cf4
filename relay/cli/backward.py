"""Reading a journal file from its end, in blocks that grow from a few lines to a MiB, so a viewer
of a journal's end reads about what it shows. Lines are split at newlines only (a stray ``\\r``
stays inside its line, as ``relay tail --json`` prints it); empty lines are left out.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from relay.journal.recovery import FIRST_BLOCK, MAX_BLOCK

Identity = tuple[int, int]  # (st_dev, st_ino): which file a name stood for


def lines_backwards(path: Path, end: int | None = None,
                    identity: Identity | None = None) -> Iterator[bytes]:
    """The lines of ``path`` before byte ``end`` (None: its size), last first. Nothing when the file
    is gone, or is no longer the one ``identity`` names (replaced since it was looked at)."""
    return (line for _, line in placed_lines_backwards(path, end, identity))


def placed_lines_backwards(path: Path, end: int | None = None,
                           identity: Identity | None = None) -> Iterator[tuple[int, bytes]]:
    """lines_backwards, each line with the offset it starts at (where ``lines_from`` reads it
    again)."""
    opened = _open(path, identity)
    if opened is None:
        return
    fd, size = opened
    try:
        pos = size if end is None else min(end, size)
        block, rest = FIRST_BLOCK, b""
        while pos > 0:
            size = min(block, pos)
            pos -= size
            data = os.pread(fd, size, pos) + rest
            lines = data.split(b"\n")
            # the end of a line that began in an earlier block (or the file's first)
            rest = lines[0]
            after = pos + len(data)  # where the line being looked at ends
            for line in reversed(lines[1:]):
                after -= len(line)
                if line:
                    yield after, line
                after -= 1  # its newline
            block = min(block * 2, MAX_BLOCK)
        if rest:
            yield 0, rest
    finally:
        os.close(fd)


def lines_from(path: Path, start: int, end: int,
               identity: Identity | None = None) -> Iterator[bytes]:
    """The lines of ``path`` from byte ``start`` to byte ``end``, first first, read a block at a
    time (memory: a block): what a reader from the end found there, read again forwards."""
    opened = _open(path, identity)
    if opened is None:
        return
    fd, size = opened
    try:
        pos, end, rest = start, min(end, size), b""
        while pos < end:
            data = rest + os.pread(fd, min(MAX_BLOCK, end - pos), pos)
            pos += len(data) - len(rest)
            lines = data.split(b"\n")
            rest = lines.pop()
            yield from (line for line in lines if line)
        if rest:
            yield rest
    finally:
        os.close(fd)


def _open(path: Path, identity: Identity | None) -> tuple[int, int] | None:
    """``path`` opened for reading, and its size; None when it is gone, or is no longer the file
    ``identity`` names (replaced since it was looked at)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    stat = os.fstat(fd)
    if identity is not None and (stat.st_dev, stat.st_ino) != identity:
        os.close(fd)
        return None
    return fd, stat.st_size

