"""The one way a sink is driven, by its process, by ``relay replay`` and by the tests, so a sink
behaves the same live and replayed (docs/relay.md, "What the relay does with an event", step 4).

A close that overruns its deadline is left running on its own thread. Waiting and the clock are
the caller's (``wait``, ``clock``), so the state machine runs in tests without sleeping.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from relay.journal.deadletter import DeadLetters, EventKey, event_key
from relay.wire.lines import encode_line
from sinks.base import CLOSE_TIMEOUT, CatchesUp, PermanentError, Sink
from sinks.events import as_events

log = logging.getLogger(__name__)

BACKOFF_START = 0.1
BACKOFF_MAX = 30.0
FLUSH_EVERY = 1.0  # seconds: the sink is flushed at least this often while batches keep coming
FLUSH_TIMEOUT = 10.0  # seconds a flush may take before the sink should say it did not complete

Batch = Sequence[dict[str, Any]]


def sleep_for(limit: float, clock: Callable[[], float] = time.monotonic) -> Callable[[float], bool]:
    """A ``wait`` that sleeps, and gives up (False) once retrying would go past ``limit`` seconds
    from its first wait since the last success (``relay replay``: a sink down for good ends it)."""
    started: list[float] = []

    def wait(seconds: float) -> bool:
        if seconds <= 0:  # the driver says: a batch got through, start counting afresh
            started.clear()
            return True
        if not started:
            started.append(clock())
        if clock() + seconds - started[0] > limit:
            return False
        time.sleep(seconds)
        return True
    return wait


class SinkDriver:
    """Writes batches to ``sink``: retries, backoff, bisection to dead letters, flushes, counters.

    ``wait(seconds)`` backs off between attempts and returns False to give up (shutting down; the
    batch stays unwritten, in the journal); it is also called with 0 after a batch that needed
    retries got through. ``fault(batch)``, if given, runs before each ``sink.write`` and may raise
    as the sink would: how a test causes a failure the backend cannot be made to produce."""

    def __init__(self, name: str, sink: Sink, deadletters: DeadLetters | None = None, *,
                 wait: Callable[[float], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 flush_every: float = FLUSH_EVERY, on_recovered: Callable[[], None] | None = None,
                 fault: Callable[[Batch], None] | None = None) -> None:
        self.name = name
        self.sink = sink
        self.deadletters = deadletters
        self.written = 0
        # events a catch-up pass handed to write() (most of them already applied)
        self.caught_up = 0
        self.errors = 0
        self.retries = 0
        self.flushes = 0
        self.dead_lettered = 0
        self.deadletter_overflow = 0
        self.incomplete_flushes = 0  # the sink said its flush did not complete in time
        self.incomplete_closes = 0  # its close said so, or overran its deadline
        self.resolved = 0  # events of the batch in hand already written or dead-lettered
        self.last_error = ""  # what the latest failure said (the replay's message when it gives up)
        self._wait = wait or sleep_for(float("inf"))
        self._clock = clock
        self._flush_every = flush_every
        self._next_flush = clock() + flush_every
        self._on_recovered = on_recovered
        self._fault = fault
        #: events dead-lettered already (by an earlier process too): a catch-up does not refuse them
        #: again
        self._refused: set[EventKey] = (set() if deadletters is None
                                        else deadletters.refused_events())

    def stats(self) -> dict[str, Any]:
        """Counters, plus the sink's own ``counters`` mapping if it keeps one."""
        own = getattr(self.sink, "counters", None)
        extra = {"sink": dict(own)} if isinstance(own, dict) else {}
        return {"written": self.written, "errors": self.errors, "dead_lettered": self.dead_lettered,
                "deadletter_overflow": self.deadletter_overflow, "caught_up": self.caught_up,
                "incomplete_flushes": self.incomplete_flushes,
                "incomplete_closes": self.incomplete_closes, **extra}

    def count_error(self) -> None:
        """An error outside ``write`` (the sink's catch-up could not read the journal)."""
        self.errors += 1

    def write(self, batch: Batch, caught_up: bool = False) -> bool:
        """Write ``batch`` (a catch-up pass's with ``caught_up``), retrying transient errors with
        backoff; False when ``wait`` gave up first. A catch-up's events already dead-lettered are
        left out: the sink refused them for good, and the dead-letter file holds them once."""
        self.resolved = 0
        if caught_up and self._refused:
            batch = [event for event in batch if event_key(event) not in self._refused]
        return not batch or self._deliver(batch, caught_up)

    def fill_holes(self, read: Callable[[str], Iterable[Batch]]) -> bool:
        """For each run a sink that ``CatchesUp`` names in ``holes([])``, write it (as a catch-up)
        every batch ``read(run)`` gives, the journal's events of that run the sink may lack, then
        tell it ``holes(filled)``; False when ``wait`` gave up first (shutting down: the sink's next
        process finds the hole in its saved spans). A plugin's ``holes()`` that raises is counted
        and logged, and the flush goes on: the runs it named stay named and are read again at the
        next one."""
        filled: list[str] = []
        for run in self._holes(filled):
            events = 0
            for batch in read(run):
                if batch and not self.write(batch, caught_up=True):
                    return False
                events += len(batch)
            filled.append(run)
            log.info("sink %s: run %s caught up from the journal (%d events read, what it had "
                     "already applied skipped)", self.name, run, events)
        if filled:
            self._holes(filled)  # what it names now waits for the next flush
        return True

    def _holes(self, filled: list[str]) -> list[str]:
        if not isinstance(self.sink, CatchesUp):
            return []
        try:
            return list(self.sink.holes(filled))
        except Exception as exc:  # a plugin's bug: counted; the writer thread must live on
            self._failed("failed to name its holes", exc, 0.0)
            return []

    def after_batch(self, idle: bool, read: Callable[[str], Iterable[Batch]] | None = None) -> None:
        """Flush when nothing is waiting (``idle``) or ``flush_every`` has passed; with ``read``,
        first fill the sink's holes from it (``fill_holes``)."""
        if (idle or self._clock() >= self._next_flush) and (read is None or self.fill_holes(read)):
            self.flush()

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        """``sink.flush(timeout)``; False (counted, logged) when it failed or did not complete: the
        next flush tries again, and a catch-up pass does not take what it wrote as durable."""
        self._next_flush = self._clock() + self._flush_every
        try:
            complete = self.sink.flush(timeout)
        except Exception as exc:  # counted; the data was written, the next flush tries again
            self._failed("failed to flush", exc, 0.0)
            return False
        if not complete:
            self.incomplete_flushes += 1
            if self.incomplete_flushes <= 3 or self.incomplete_flushes % 100 == 0:
                log.warning("sink %s: flush not complete within %.1f s (%d so far); the next "
                            "flush goes on", self.name, timeout, self.incomplete_flushes)
            return False
        self.flushes += 1
        return True

    def finish(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """The last flush, then close the sink and its dead-letter file, all within ``timeout``
        seconds; whether both completed (a failure counted, not raised: one sink failing to close
        must not stop the others)."""
        deadline = time.monotonic() + timeout
        flushed = self.flush(timeout)
        return self.close(max(0.0, deadline - time.monotonic())) and flushed

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """``sink.close(timeout)`` on a thread of its own, waited for ``timeout`` seconds: a tool
        that cannot be reached (Aim's remote client waits without limit) is left closing, and the
        caller goes on. False, counted and logged, when the sink said it did not complete or
        overran."""
        outcome: list[bool | None] = []  # None: it raised
        closer = threading.Thread(target=self._close_sink, args=(timeout, outcome),
                                  name=f"sink-{self.name}-close", daemon=True)
        closer.start()
        closer.join(timeout)
        if self.deadletters is not None:
            self.deadletters.close()
        if outcome == [True]:
            return True
        if outcome != [None]:  # an exception was counted and logged already
            self.incomplete_closes += 1
            log.warning("sink %s: close %s within %.1f s; what it had not made durable is in the "
                        "journal (a catching-up sink reads it at its next start, `relay replay` "
                        "rebuilds any sink)", self.name,
                        "still running, left behind," if not outcome else "not complete", timeout)
        return False

    def _close_sink(self, timeout: float, outcome: list[bool | None]) -> None:
        try:
            outcome.append(bool(self.sink.close(timeout)))
        except Exception as exc:  # counted: a sink failing to close must not stop the others
            self.errors += 1
            log.error("sink %s failed to close: %s: %s", self.name, type(exc).__name__, exc)
            outcome.append(None)

    def _deliver(self, batch: Batch, caught_up: bool) -> bool:
        backoff = BACKOFF_START
        failed = False
        while True:
            try:
                if self._fault is not None:
                    self._fault(batch)
                self.sink.write(as_events(batch))
            except PermanentError as exc:
                if len(batch) == 1:
                    self._dead_letter(batch[0], exc)
                    return True
                half = len(batch) // 2  # the events that fail on their own, found in log2(n) rounds
                return (self._deliver(batch[:half], caught_up)
                        and self._deliver(batch[half:], caught_up))
            except Exception as exc:  # isolated and counted; the batch is retried
                self._failed("failed", exc, backoff)
                failed = True
                if not self._wait(backoff):
                    return False
                self.retries += 1
                backoff = min(backoff * 2, BACKOFF_MAX)
            else:
                if caught_up:  # not "written": the relay compares that with the events it sent
                    self.caught_up += len(batch)
                else:
                    self.written += len(batch)
                self.resolved += len(batch)
                if failed:
                    self._wait(0.0)
                    if self._on_recovered is not None:
                        self._on_recovered()
                return True

    def _dead_letter(self, event: dict[str, Any], exc: PermanentError) -> None:
        key = event_key(event)
        if key is not None:
            self._refused.add(key)
        self.dead_lettered += 1
        self.resolved += 1
        detail = str(exc) or type(exc).__name__
        kept = (self.deadletters is not None
                and self.deadletters.add_event("permanent", detail, encode_line(event)))
        if not kept:
            self.deadletter_overflow += 1
        if self.dead_lettered <= 10 or self.dead_lettered % 1000 == 0:
            where = "" if self.deadletters is None else (
                f", kept in {self.deadletters.path}" if kept
                else ", not kept (dead-letter file full)")
            log.error("sink %s refused run %s rank %s seq %s for good (%d so far)%s: %s", self.name,
                      event.get("run"), event.get("rank"), event.get("seq"), self.dead_lettered,
                      where, detail)

    def _failed(self, what: str, exc: Exception, backoff: float) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.errors <= 3 or self.errors % 100 == 0:
            log.error("sink %s %s (%d errors so far), retrying in %.1f s: %s: %s",
                      self.name, what, self.errors, backoff, type(exc).__name__, exc)
