"""Inside a sink's process: journal lines from the relay written to the sink, or for a shipper
(relay/ship/base.py) the news of each journal write handed to ``notify``.

    python -m relay.sinkhost.child SPEC_JSON     (started by relay/sinkhost/process.py,
                                                  under relay/sinkhost/lifeline.py)

Child -> relay, one JSON object per line on the child's own stdout: ``{"ready": true}`` or
``{"error": MESSAGE}`` once, then its counters every ``STATS_PERIOD`` and at exit; the sink's own
stdout goes to stderr, the relay's log. One thread reads the pipe and one ``BatchWorker`` thread
drives the sink (relay/sinkhost/driver.py), so reading never waits for a slow or failing sink.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from relay.journal.deadletter import DeadLetters
from relay.journal.journal import Journal
from relay.journal.reader import LineDecoder
from relay.ship.base import Shipper, load
from relay.sinkhost.batch_queue import BatchWorker
from relay.sinkhost.catch_up import CatchUp
from relay.sinkhost.driver import SinkDriver
from relay.sinkhost.lifeline import hold_sink_lock
from relay.sinkhost.notices import NoticeDecoder
from relay.sinkhost.spec import SinkSpec
from sinks.base import CatchesUp, Sink, SinkContext, SinkError

log = logging.getLogger(__name__)

NICE = 19  # added to the relay's niceness (capped at 19): ingest first
STATS_PERIOD = 0.5
READ_SIZE = 1 << 20

T = TypeVar("T")


#: What the queue holds to ask for a catch-up pass (relay/sinkhost/catch_up.py) in turn with the
#: batches: a list of its own, told apart by identity (a batch of events is never empty).
CATCH_UP_PASS: Sequence[dict[str, Any]] = []
CLOSE_AT_LEAST = 0.5  # seconds a sink gets to close after a drain that took all of the shutdown's


class SinkWriter:
    """The sink, fed by a bounded BatchWorker and written by a SinkDriver (relay/sinkhost/driver.py:
    retries, dead letters, flushes, counters); and, with ``catch_up``, passes over the journal
    (relay/sinkhost/catch_up.py) on the same thread, in turn, and before each flush the journal's
    events of the runs the sink names in ``holes()``."""

    def __init__(self, name: str, sink: Sink, max_events: int, deadletters: DeadLetters | None,
                 catch_up: CatchUp | None = None) -> None:
        self.name = name
        self.sink = sink
        self.catch_up = catch_up
        self.catch_up_passes = 0
        self._pass_queued = False
        self._in_pass = False
        self.bad_lines = 0  # lines from the relay that were not events (counted as dropped)
        self.worker: BatchWorker[Sequence[dict[str, Any]]] = BatchWorker(
            name, self._handle, max_events, after=self._after)
        self.driver = SinkDriver(name, sink, deadletters, wait=self.worker.wait,
                                 on_recovered=self._recovered)

    def start(self) -> None:
        self.worker.start()

    def submit(self, events: Sequence[dict[str, Any]]) -> None:
        if events:
            self.worker.submit(events, len(events))

    def request_catch_up(self) -> None:
        """Queue a pass over the journal behind what is queued (one at a time; any thread)."""
        if self.catch_up is not None and not self._pass_queued:
            self._pass_queued = True
            self.worker.submit(CATCH_UP_PASS, 0)

    def not_events(self, lines: int) -> None:
        """``lines`` from the relay so far were not events (the decoder's count): counted as
        dropped, and said when there are new ones."""
        if lines > self.bad_lines:
            log.error("sink %s: %d lines from the relay were not events; dropped", self.name, lines)
            self.bad_lines = lines

    @property
    def overflowed(self) -> int:
        """Events of batches the queue had no room for (in the journal: a catch-up reads them)."""
        return self.worker.dropped

    def stats(self) -> dict[str, Any]:
        return {**self.driver.stats(), "dropped": self.worker.dropped + self.bad_lines,
                "queued": self.worker.queued, "catch_up_passes": self.catch_up_passes}

    def close(self, timeout: float) -> None:
        """Drain what is queued (retrying until ``timeout``), then close the sink in what is left of
        it (at least ``CLOSE_AT_LEAST`` seconds)."""
        deadline = time.monotonic() + timeout
        left = self.worker.close(timeout)
        if left:
            resolved = min(left, self.driver.resolved)
            self.worker.got_through(resolved)  # half a narrowed batch
            log.error("sink %s: %d events not written at shutdown (they are in the journal: use "
                      "relay replay)", self.name, left - resolved)
        self.driver.close(max(CLOSE_AT_LEAST, deadline - time.monotonic()))

    def _handle(self, batch: Sequence[dict[str, Any]]) -> bool:
        if batch is CATCH_UP_PASS:
            return self._catch_up_pass()
        return self.driver.write(batch)

    def _after(self, idle: bool) -> None:
        try:
            self.driver.after_batch(idle, None if self.catch_up is None
                                    else self.catch_up.run_batches)
        except OSError as exc:  # the run's hole stays named: the next flush tries again
            self._unreadable(exc)

    def _unreadable(self, exc: OSError) -> None:
        self.driver.count_error()
        log.error("sink %s: catch-up from the journal failed: %s", self.name, exc)

    def _recovered(self) -> None:
        """Once the sink takes a batch after failing, a catch-up pass follows (its backend is
        back)."""
        if not self._in_pass:
            log.info("sink %s works again; a catch-up from the journal follows", self.name)
            self.request_catch_up()

    def _catch_up_pass(self) -> bool:
        """Hand the journal's recent events the sink may lack to ``write()``, file by file; False
        when shutting down first (the next process's pass goes on from what was delivered)."""
        catch_up = self.catch_up
        assert catch_up is not None
        self._pass_queued, self._in_pass = False, True
        started, files, events = time.monotonic(), 0, 0
        try:
            for path, start, size in catch_up.due():
                files += 1
                for batch, offset in catch_up.read(path, start, size):
                    if batch and not self.driver.write(batch, caught_up=True):
                        return False
                    events += len(batch)
                    if self.driver.flush():  # durable in the tool before the state file says so
                        catch_up.delivered(path, offset)
        except OSError as exc:  # the journal unreadable for now: the next pass tries again
            self._unreadable(exc)
            return True
        finally:
            self._in_pass = False
        self.catch_up_passes += 1
        if events:
            log.info("sink %s caught up from the journal: %d events of %d files read in %.1f s "
                     "(what it had already applied is skipped)", self.name, events, files,
                     time.monotonic() - started)
        return True


def _options(cls: type[Sink] | type[Shipper], given: dict[str, Any]) -> dict[str, Any]:
    """The sink's options as its click types make them (the relay sent them as JSON)."""
    ctx = click.Context(click.Command("relay"))
    return {o.name: o.type_cast_value(ctx, given[o.name]) for o in cls.options() if o.name in given}


def build_sink(spec: SinkSpec) -> Sink | Shipper:
    """The sink or shipper ``spec`` names, built with its options: what the relay checks before it
    listens (relay/sinkhost/check.py) and what its process then opens. SinkError if not."""
    cls = load(spec.source or spec.name)
    return cast("Sink | Shipper", starting(spec.name, cls, **_options(cls, spec.options)))


def starting(name: str, step: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """One of a sink's start-up steps (building it, opening it), wherever it runs (its process,
    ``relay replay``): a plugin's own bug there is the SinkError that says so in one line."""
    try:
        return step(*args, **kwargs)
    except SinkError:
        raise
    except Exception as exc:  # a plugin's own bug: reported as the reason it cannot start
        raise SinkError(f"sink {name} failed to start: {type(exc).__name__}: {exc}") from None


def child_main(spec: SinkSpec) -> int:
    # Ctrl-C reaches the whole group; the relay decides
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(NICE)
    channel = os.dup(1)
    parent_gone = threading.Event()
    os.dup2(2, 1)  # whatever the sink prints goes to the log, not into the protocol

    def send(message: dict[str, Any]) -> None:
        try:
            os.write(channel, json.dumps(message).encode() + b"\n")
        # the relay is gone (killed): its successor counts anew; say it once
        except BrokenPipeError:
            if not parent_gone.is_set():
                parent_gone.set()
                logging.getLogger(__name__).warning("sink %s: the relay that started it is gone; "
                                                    "finishing without reporting counters",
                                                    spec.name)

    line = f"%(asctime)s %(levelname)s %(name)s [sink {spec.name} {os.getpid()}]: %(message)s"
    logging.basicConfig(level=spec.log_level.upper(), stream=sys.stderr, format=line)
    if spec.journal:  # held until the process ends: one process per sink and journal
        hold_sink_lock(Journal(spec.journal).sidecar(f"_sink_{spec.name}.lock"), spec.name)
    try:
        worker = build_sink(spec)
        starting(spec.name, worker.open,
                 SinkContext(journal=Path(spec.journal) if spec.journal else None))
    except SinkError as exc:
        send({"error": str(exc)})
        return 2
    send({"ready": True})
    if isinstance(worker, Shipper):
        shipper = ShipperFeed(spec.name, worker)
        _pump(shipper.feed, lambda: send(shipper.stats()))
        shipper.close(spec.drain_timeout)
        send(shipper.stats())
        return 0
    catch_up = CatchUp(spec.journal, spec.name) if spec.journal and isinstance(worker, CatchesUp) \
        else None
    writer = SinkWriter(spec.name, worker, spec.max_events,
                        DeadLetters(Path(spec.deadletter)) if spec.deadletter else None, catch_up)
    writer.start()
    writer.request_catch_up()  # what this sink missed while its process was not running
    decoder = LineDecoder()
    dropped = 0

    def feed(data: bytes) -> None:
        nonlocal dropped
        if data:
            writer.submit(decoder.feed(data))
            writer.not_events(decoder.bad_lines)
        if writer.overflowed > dropped:  # batches that did not fit: read from the journal later
            dropped = writer.overflowed
            writer.request_catch_up()

    def tick() -> None:
        feed(b"")
        send(writer.stats())

    _pump(feed, tick)
    writer.close(spec.drain_timeout)
    send(writer.stats())
    return 0


def _pump(feed: Callable[[bytes], None], tick: Callable[[], None]) -> None:
    """Hand what the relay writes to ``feed`` until it closes the pipe; ``tick()`` every
    STATS_PERIOD meanwhile."""
    next_stats = time.monotonic() + STATS_PERIOD
    while True:
        if select.select([0], [], [], max(0.0, next_stats - time.monotonic()))[0]:
            data = os.read(0, READ_SIZE)
            if not data:
                return
            feed(data)
        if time.monotonic() >= next_stats:
            tick()
            next_stats = time.monotonic() + STATS_PERIOD


class ShipperFeed:
    """A shipper in its process: the relay's notices decoded into news (relay/sinkhost/notices.py)
    and handed to ``notify``; counted in events, as a sink's writes are."""

    def __init__(self, name: str, shipper: Shipper) -> None:
        self.name, self.shipper = name, shipper
        self.decoder = NoticeDecoder()
        self.written = self.errors = self.lost = self.incomplete_closes = 0

    def feed(self, data: bytes) -> None:
        news = self.decoder.feed(data)
        events = sum(count for count, _ in news.values())
        try:
            if news:
                self.shipper.notify(news)
        except Exception as exc:  # counted; the lines stay in the journal, which it rescans
            self.errors += 1
            self.lost += events
            log.error("shipper %s: notify failed: %s: %s", self.name, type(exc).__name__, exc)
            return
        self.written += events

    def stats(self) -> dict[str, Any]:
        return {"written": self.written, "errors": self.errors, "queued": 0,
                "dropped": self.lost + self.decoder.bad_lines,
                "incomplete_closes": self.incomplete_closes, "sink": dict(self.shipper.counters)}

    def close(self, timeout: float) -> None:
        """Let the shipper wait for its last acknowledgements; an incomplete close is counted."""
        try:
            complete = self.shipper.close(timeout)
        except Exception as exc:  # counted: the journal holds what it had not shipped
            self.errors += 1
            complete = False
            log.error("shipper %s failed to close: %s: %s", self.name, type(exc).__name__, exc)
        self.incomplete_closes += not complete


if __name__ == "__main__":
    status = child_main(SinkSpec(**json.loads(sys.argv[1])))
    # Closed and counted: the interpreter's exit need not walk the heap the tracker's library built
    # (MLflow's 0.5 CPU-s, docs/development.md "Where the time goes"); its exit handlers still run.
    gc.freeze()
    sys.exit(status)
