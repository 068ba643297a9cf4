"""Recovery of a journal file a crash may have left mid-write: only whole lines stay.

The relay appends each batch with one write and acknowledges it only after the write returned, so
bytes after the file's last newline belong to a batch no client was told of. They are cut exactly
there, however long the torn line (a journal line may be schema.MAX_LINE_BYTES long), before
anything reads the file to learn what it already holds (relay/journal/journal.py ``Journal.seen``),
so the dedupe state never counts an event the cut then removes.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("relay.journal.journal")


def cut_torn_tail(fd: int, path: Path) -> None:
    """Cut exactly the bytes after the last newline, however far back it is: never acknowledged."""
    size = os.fstat(fd).st_size
    keep = end_of_last_line(fd, size)
    if keep == size:
        return
    os.ftruncate(fd, keep)
    log.warning("cut a torn last line (%d bytes) from %s; its events were never acknowledged and "
                "will be resent", size - keep, path)


def end_of_last_line(fd: int, size: int) -> int:
    """The offset just after the last newline before ``size`` in the open file ``fd`` (0: none):
    where the whole lines end and a torn line, or one still being written, begins. Read backwards
    in blocks doubling from 8 KiB to a MiB, so a short last line costs one small read."""
    pos, block = size, 8 << 10
    while pos > 0:
        start = max(0, pos - block)
        found = os.pread(fd, pos - start, start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        pos, block = start, min(block * 2, 1 << 20)
    return 0
