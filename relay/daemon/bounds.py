"""What keeps the relay process within bounds whatever its peers do: a budget of new runs per
connection, the bytes it holds between receiving and journaling, its resident memory, its
descriptor limit, the process it watches, and who may read the files it makes."""
from __future__ import annotations

import logging
import os
import resource

log = logging.getLogger("relay")

#: Journal-line bytes the ingest loop holds between receiving frames and committing them: at this
#: it stops reading, journals, acknowledges and checks its memory, whatever the flush interval
#: says. With one frame's lines (at most schema.MAX_FRAME_LINES_BYTES) it is what it ever holds.
COMMIT_BYTES = 16 << 20
#: Frame bytes read in one loop turn (refused and duplicate frames add no lines, but cost reading).
TURN_BYTES = 16 << 20
#: Messages ZeroMQ queues per connection before it stops reading that peer's socket: with frames of
#: up to schema.MAX_FRAME_BYTES, 64 MiB per connection (256 MiB of oversize messages it rejects).
RECV_HWM = 64
MAX_PEERS = 65_536  # connections whose new-run budget is remembered; the least recent are forgotten


class RunBudget:
    """Token bucket per connection: ``rate`` new run ids a minute, as many at once."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        #: peer -> (new runs it may start, as of when)
        self._budget: dict[bytes, tuple[float, float]] = {}

    def admit(self, peer: bytes, runs: int, now: float) -> bool:
        """Take ``runs`` new runs from ``peer``'s budget; False (none taken) if it has too few."""
        rate = self.rate
        tokens, since = self._budget.pop(peer, (rate, now))
        tokens = min(rate, tokens + (now - since) * rate / 60.0)
        if len(self._budget) >= MAX_PEERS:
            del self._budget[next(iter(self._budget))]
        if tokens < runs:
            self._budget[peer] = (tokens, now)
            return False
        self._budget[peer] = (tokens - runs, now)
        return True


class MemoryProbe:
    """This process's resident set size, read from /proc (about a microsecond); 0 without /proc."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None
        self._page = os.sysconf("SC_PAGE_SIZE")

    def rss_mib(self) -> int:
        if self._fd is None:
            return 0
        return int(os.pread(self._fd, 128, 0).split()[1]) * self._page >> 20


def trim_heap() -> None:
    """Hand the freed heap back to the system (glibc keeps it otherwise): RSS shows the relief."""
    # here, not at the top: every relay and CLI process imports this module, few trim
    import ctypes.util

    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim(0)


def raise_file_limit() -> None:
    """Every connection and open run file is a descriptor; take the hard limit, not the soft one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.debug("could not raise the open-file limit from %d: %s", soft, exc)


def private_files(world_readable: bool) -> None:
    """Unless ``world_readable``, what the relay (and its sink processes) create from now on is its
    user's alone: files 0600, folders 0700 (the umask gains 077; what exists keeps its mode).
    The journal names every run and its seqs, which is what a local peer needs to forge events."""
    if not world_readable:
        os.umask(os.umask(0o077) | 0o077)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
