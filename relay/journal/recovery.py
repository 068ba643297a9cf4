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

#: Reading a file backwards: the first block, a few lines (a directory of thousands of runs reads
#: one each), doubled up to the largest
FIRST_BLOCK = 8 << 10
MAX_BLOCK = 1 << 20


def cut_torn_tail(fd: int, path: Path) -> None:
    """Cut exactly the bytes after the last newline, however far back it is (a crash mid-write).
    They were never acknowledged (acks follow whole batches), so their clients resend them."""
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
    pos, block = size, FIRST_BLOCK
    while pos > 0:
        start = max(0, pos - block)
        found = os.pread(fd, pos - start, start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        pos, block = start, min(block * 2, MAX_BLOCK)
    return 0
