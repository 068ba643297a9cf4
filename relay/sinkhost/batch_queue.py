"""A bounded queue drained by one thread: the one place a sink's backlog is bounded, and what does
not fit is dropped whole and counted, never waited for (it stays in the journal).

Used on both sides of a sink's process (relay/sinkhost/process.py, relay/sinkhost/child.py). A
batch leaves the queue only once ``handle`` is done with it, so the bound covers the one in hand.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class BatchWorker(Generic[T]):
    """``handle(batch)`` runs on the worker's thread, one batch at a time, in order; it returns True
    once done with the batch, False to stop the worker at once (shutting down), leaving it queued.
    ``after(idle)``, if given, runs after each batch, ``idle`` when nothing else is queued (the
    sink's driver flushes then, or when its interval has passed)."""

    def __init__(self, name: str, handle: Callable[[T], bool], max_events: int, *,
                 after: Callable[[bool], None] | None = None,
                 finish: Callable[[], None] | None = None,
                 max_bytes: int | None = None) -> None:
        """``finish``, if given, runs on the worker's thread when it stops; ``max_bytes`` bounds the
        sizes given to ``submit`` (one batch is always taken into an empty queue)."""
        self.name = name
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.dropped = 0  # events of batches that did not fit, or were left at shutdown
        self._handle = handle
        self._after = after
        self._finish = finish
        self._queue: collections.deque[tuple[T, int, int]] = collections.deque()
        self._queued = 0
        self._bytes = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._deadline = float("inf")
        self._thread = threading.Thread(target=self._run, name=f"sink-{name}", daemon=True)

    @property
    def queued(self) -> int:
        """Events waiting, the batch in hand included."""
        return self._queued

    @property
    def stopping(self) -> bool:
        return self._stopping

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: T, count: int, size: int = 0) -> bool:
        """Queue ``batch`` of ``count`` events (``size`` bytes) without waiting; False (dropped,
        counted, logged now and then) when it would take the queue past ``max_events`` or
        ``max_bytes``."""
        with self._cond:
            over_bytes = (self.max_bytes is not None and self._queue
                          and self._bytes + size > self.max_bytes)
            if self._queued + count > self.max_events or over_bytes:
                self.dropped += count
                if self.dropped == count or self.dropped % 100_000 < count:
                    log.warning("sink %s is %d events behind; dropped %d so far (they are in the "
                                "journal: relay replay rebuilds it)", self.name, self._queued,
                                self.dropped)
                return False
            self._queue.append((batch, count, size))
            self._queued += count
            self._bytes += size
            self._cond.notify()
            return True

    def wait(self, seconds: float, drain: bool = True) -> bool:
        """Back off for ``seconds`` (new batches do not cut it short). False when the worker is
        stopping and, with ``drain``, its drain deadline would pass first (without, at once)."""
        until = time.monotonic() + seconds
        with self._cond:
            while True:
                if self._stopping and (not drain or until > self._deadline):
                    return False
                now = time.monotonic()
                if now >= until:
                    return True
                self._cond.wait(until - now)

    def close(self, timeout: float) -> int:
        """Let the thread drain what is queued for up to ``timeout`` seconds, then stop it; returns
        the events left over, which count as dropped."""
        self.stop(timeout)
        self.join(timeout + 5.0)
        return self.abandon()

    def stop(self, timeout: float) -> None:
        """Drain what is queued, for up to ``timeout`` seconds (``wait`` keeps to it), then stop."""
        with self._cond:
            self._stopping = True
            self._deadline = time.monotonic() + timeout
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(max(0.0, timeout))

    def abandon(self) -> int:
        """Count what is still queued as dropped; returns how many events that was."""
        with self._cond:
            left, self._queued, self._bytes = self._queued, 0, 0
            self._queue.clear()
            self.dropped += left
        return left

    def got_through(self, events: int) -> None:
        """``events`` counted as dropped at close were written after all (half a narrowed batch)."""
        with self._cond:
            self.dropped -= events

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._stopping:
                        self._cond.wait()
                    if not self._queue:
                        return
                    batch, count, size = self._queue[0]
                if not self._handle(batch):
                    return
                with self._cond:
                    # (abandon() may have emptied it)
                    if self._queue and self._queue[0][0] is batch:
                        self._queue.popleft()
                        self._queued -= count
                        self._bytes -= size
                    idle = not self._queue
                if self._after is not None:
                    self._after(idle)
        finally:
            if self._finish is not None:
                self._finish()
