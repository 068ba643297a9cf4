"""Inside a sink's process (relay/sinkproc.py), the thread that writes to the sink, so reading
the relay's lines never waits for a slow or failing sink.

A failed batch is retried, whole and in order, with exponential backoff; the queue is bounded by
events, and what does not fit is counted as dropped for that sink (it stays in the journal, from
which ``relay replay`` rebuilds the sink).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Sequence

from sinks.base import Sink

log = logging.getLogger(__name__)

BACKOFF_START = 0.1
BACKOFF_MAX = 30.0


class SinkWorker:
    def __init__(self, sink: Sink, max_events: int = 200_000) -> None:
        self.sink = sink
        self.max_events = max_events
        self.written = 0
        self.errors = 0
        self.dropped = 0
        self._queue: collections.deque[Sequence[dict[str, Any]]] = collections.deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"sink-{sink.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: Sequence[dict[str, Any]]) -> None:
        """Hand over a batch without waiting; counted as dropped if the queue is full."""
        with self._cond:
            if self._queued + len(batch) > self.max_events:
                self.dropped += len(batch)
                if self.dropped == len(batch) or self.dropped % 100_000 < len(batch):
                    log.warning("sink %s is %d events behind; dropped %d so far (replay the journal to "
                                "rebuild it)", self.sink.name, self._queued, self.dropped)
                return
            self._queue.append(batch)
            self._queued += len(batch)
            self._cond.notify()

    def stats(self) -> dict[str, Any]:
        """The worker's counters, plus the sink's own ``counters`` mapping if it keeps one."""
        own = getattr(self.sink, "counters", None)
        extra = {"sink": dict(own)} if isinstance(own, dict) else {}
        return {"written": self.written, "errors": self.errors, "dropped": self.dropped, "queued": self._queued,
                **extra}

    def close(self, timeout: float) -> None:
        """Drain what is queued (retrying until ``timeout``), then close the sink."""
        with self._cond:
            self._stopping = True
            self._deadline = time.monotonic() + timeout
            self._cond.notify()
        self._thread.join(timeout + 5.0)
        if self._queued:
            self.dropped += self._queued
            log.error("sink %s: %d events not written at shutdown (they are in the journal: use "
                      "relay replay)", self.sink.name, self._queued)
        try:
            self.sink.close()
        except Exception as exc:  # counted: a sink failing to close must not stop the others
            self.errors += 1
            log.error("sink %s failed to close: %s: %s", self.sink.name, type(exc).__name__, exc)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = self._queue[0]
            if not self._deliver(batch):
                return
            with self._cond:
                self._queue.popleft()
                self._queued -= len(batch)

    def _deliver(self, batch: Sequence[dict[str, Any]]) -> bool:
        backoff = BACKOFF_START
        while True:
            try:
                self.sink.write(batch)
            except Exception as exc:  # isolated and counted; the batch is retried
                self._failed("failed", exc, backoff)
            else:
                self.written += len(batch)
                if len(self._queue) <= 1:
                    self._flush()
                return True
            if not self._sleep(backoff):
                return False
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _sleep(self, seconds: float) -> bool:
        """Back off for ``seconds`` (new batches arriving do not cut it short); False when
        shutting down and the drain deadline would pass first."""
        until = time.monotonic() + seconds
        with self._cond:
            while True:
                now = time.monotonic()
                if self._stopping and until > self._deadline:
                    return False
                if now >= until:
                    return True
                self._cond.wait(until - now)

    def _flush(self) -> None:
        try:
            self.sink.flush()
        except Exception as exc:  # counted; the data was written, the next flush tries again
            self._failed("failed to flush", exc, 0.0)

    def _failed(self, what: str, exc: Exception, backoff: float) -> None:
        self.errors += 1
        if self.errors <= 3 or self.errors % 100 == 0:
            log.error("sink %s %s (%d errors so far), retrying in %.1f s: %s: %s",
                      self.sink.name, what, self.errors, backoff, type(exc).__name__, exc)
