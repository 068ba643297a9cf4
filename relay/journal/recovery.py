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

CHUNK = 1 << 20  # read backwards this much at a time while looking for the last newline


def cut_torn_tail(fd: int, path: Path) -> None:
    """Cut exactly the bytes after the last newline, however far back it is: never acknowledged."""
    size = os.fstat(fd).st_size
    keep = _whole_lines_end(fd, size)
    if keep == size:
        return
    os.ftruncate(fd, keep)
    log.warning("cut a torn last line (%d bytes) from %s; its events were never acknowledged and "
                "will be resent", size - keep, path)


def _whole_lines_end(fd: int, size: int) -> int:
    """The offset just past the last newline in the file's first ``size`` bytes (0 if none), read
    backwards a chunk at a time."""
    end = size
    while end > 0:
        start = max(0, end - CHUNK)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0
