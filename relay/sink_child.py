"""Inside a sink's process: read journal lines from the relay, write them to the sink.

    python -m relay.sink_child SPEC_JSON     (started by relay/sink_process.py, not by hand)

Relay -> child, on stdin: journal lines (``relay.journal.LineDecoder`` turns them into events, as
``relay replay`` would: non-finite metrics restored; for a sink whose ``wants_events`` is False,
into stand-ins that hold only the run, without decoding the lines). Child -> relay, one JSON object per line on
the child's own stdout: ``{"ready": true}`` or ``{"error": MESSAGE}`` once, then its counters every
``STATS_PERIOD`` and at exit. The sink's own stdout goes to stderr, which is the relay's log.

One thread reads the pipe; one ``BatchWorker`` thread writes to the sink, so reading never waits
for a slow or failing sink. A batch that raises is retried, whole and in order, with backoff
(``BACKOFF_START`` to ``BACKOFF_MAX``); one that raises ``PermanentError`` is narrowed down by
halves to the events that fail on their own, which go to the sink's dead-letter file with the
error's message (``dead_lettered``), and the rest is written. ``flush()`` follows a batch that
empties the queue, and comes at least every ``FLUSH_EVERY`` seconds under steady load.
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import click

from relay.batching import BatchWorker
from relay.deadletter import DeadLetters
from relay.journal import JournalReader, LineDecoder, encode_line
from sinks.base import PermanentError, Sink, SinkContext, SinkError

log = logging.getLogger(__name__)

NICE = 19  # added to the relay's niceness (capped at 19): ingest first
STATS_PERIOD = 0.5
READ_SIZE = 1 << 20
BACKOFF_START = 0.1
BACKOFF_MAX = 30.0
FLUSH_EVERY = 1.0  # seconds: the sink is flushed at least this often while batches keep coming


@dataclass
class SinkSpec:
    """What a child needs to build its sink: its name, what to load (a registry name or
    ``module:Class``) and the sink's own CLI options; the journal it may read to catch up, and its
    dead-letter file."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # what sinks.registry.load gets; the name when empty
    journal: str | None = None  # ends with os.sep in the directory layout
    deadletter: str | None = None
    max_events: int = 200_000
    drain_timeout: float = 10.0
    log_level: str = "INFO"


class SinkWriter:
    """The sink, fed by a bounded BatchWorker: retries, dead letters, flushes, counters."""

    def __init__(self, name: str, sink: Sink, max_events: int, deadletters: DeadLetters | None) -> None:
        self.name = name
        self.sink = sink
        self.deadletters = deadletters
        self.written = 0
        self.errors = 0
        self.dead_lettered = 0
        self.deadletter_overflow = 0
        self.bad_lines = 0  # lines from the relay that were not events (counted as dropped)
        self._resolved = 0  # events of the batch in hand already written or dead-lettered
        self.worker: BatchWorker[Sequence[dict[str, Any]]] = BatchWorker(
            name, self._handle, max_events, flush=self._flush, flush_every=FLUSH_EVERY)

    def start(self) -> None:
        self.worker.start()

    def submit(self, events: Sequence[dict[str, Any]]) -> None:
        if events:
            self.worker.submit(events, len(events))

    def stats(self) -> dict[str, Any]:
        """Counters, plus the sink's own ``counters`` mapping if it keeps one."""
        own = getattr(self.sink, "counters", None)
        extra = {"sink": dict(own)} if isinstance(own, dict) else {}
        return {"written": self.written, "errors": self.errors, "dropped": self.worker.dropped + self.bad_lines,
                "queued": self.worker.queued, "dead_lettered": self.dead_lettered,
                "deadletter_overflow": self.deadletter_overflow, **extra}

    def close(self, timeout: float) -> None:
        """Drain what is queued (retrying until ``timeout``), then close the sink."""
        left = self.worker.close(timeout)
        if left:
            self.worker.dropped -= min(left, self._resolved)  # half a narrowed batch did get through
            log.error("sink %s: %d events not written at shutdown (they are in the journal: use relay replay)",
                      self.name, left - min(left, self._resolved))
        try:
            self.sink.close()
        except Exception as exc:  # counted: a sink failing to close must not stop the others
            self.errors += 1
            log.error("sink %s failed to close: %s: %s", self.name, type(exc).__name__, exc)
        if self.deadletters is not None:
            self.deadletters.close()

    def _handle(self, batch: Sequence[dict[str, Any]]) -> bool:
        self._resolved = 0
        return self._deliver(batch)

    def _deliver(self, batch: Sequence[dict[str, Any]]) -> bool:
        """Write ``batch``, retrying transient errors with backoff; False when shutting down first."""
        backoff = BACKOFF_START
        while True:
            try:
                self.sink.write(batch)
            except PermanentError as exc:
                if len(batch) == 1:
                    self._dead_letter(batch[0], exc)
                    return True
                half = len(batch) // 2  # the events that fail on their own, found in log2(n) rounds
                return self._deliver(batch[:half]) and self._deliver(batch[half:])
            except Exception as exc:  # isolated and counted; the batch is retried
                self._failed("failed", exc, backoff)
                if not self.worker.wait(backoff):
                    return False
                backoff = min(backoff * 2, BACKOFF_MAX)
            else:
                self.written += len(batch)
                self._resolved += len(batch)
                return True

    def _dead_letter(self, event: dict[str, Any], exc: PermanentError) -> None:
        self.dead_lettered += 1
        self._resolved += 1
        detail = str(exc) or type(exc).__name__
        kept = self.deadletters is not None and self.deadletters.add_event("permanent", detail, encode_line(event))
        if not kept:
            self.deadletter_overflow += 1
        if self.dead_lettered <= 10 or self.dead_lettered % 1000 == 0:
            log.error("sink %s refused run %s rank %s seq %s for good (%d so far)%s: %s", self.name,
                      event.get("run"), event.get("rank"), event.get("seq"), self.dead_lettered,
                      f", kept in {self.deadletters.path}" if kept else ", not kept (dead-letter file full)", detail)

    def _flush(self) -> None:
        try:
            self.sink.flush()
        except Exception as exc:  # counted; the data was written, the next flush tries again
            self._failed("failed to flush", exc, 0.0)

    def _failed(self, what: str, exc: Exception, backoff: float) -> None:
        self.errors += 1
        if self.errors <= 3 or self.errors % 100 == 0:
            log.error("sink %s %s (%d errors so far), retrying in %.1f s: %s: %s",
                      self.name, what, self.errors, backoff, type(exc).__name__, exc)


def _options(cls: type, given: dict[str, Any]) -> dict[str, Any]:
    """The sink's options as its click types make them (the relay sent them as JSON)."""
    ctx = click.Context(click.Command("relay"))
    return {o.name: o.type_cast_value(ctx, given[o.name]) for o in cls.options() if o.name in given}


def child_main(spec: SinkSpec) -> int:
    from sinks.registry import load

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the relay decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(NICE)
    channel = os.dup(1)
    parent_gone = threading.Event()
    os.dup2(2, 1)  # whatever the sink prints goes to the log, not into the protocol

    def send(message: dict[str, Any]) -> None:
        try:
            os.write(channel, json.dumps(message).encode() + b"\n")
        except BrokenPipeError:  # the relay is gone (killed): its successor counts anew; say it once
            if not parent_gone.is_set():
                parent_gone.set()
                logging.getLogger(__name__).warning("sink %s: the relay that started it is gone; finishing "
                                                    "without reporting counters", spec.name)

    logging.basicConfig(level=spec.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s [sink {spec.name} {os.getpid()}]: %(message)s")
    try:
        cls = load(spec.source or spec.name)
        sink = cls(**_options(cls, spec.options))
        sink.open(SinkContext(journal=Path(spec.journal) if spec.journal else None,
                              journal_events=JournalReader(spec.journal) if spec.journal else None))
    except SinkError as exc:
        send({"error": str(exc)})
        return 2
    except Exception as exc:  # a plugin's own bug: reported as the reason it could not start
        send({"error": f"sink {spec.name} failed to start: {type(exc).__name__}: {exc}"})
        return 2
    send({"ready": True})
    writer = SinkWriter(spec.name, sink, spec.max_events,
                        DeadLetters(Path(spec.deadletter)) if spec.deadletter else None)
    writer.start()
    decoder = LineDecoder(runs_only=not sink.wants_events)
    next_stats = time.monotonic() + STATS_PERIOD
    while True:
        if select.select([0], [], [], max(0.0, next_stats - time.monotonic()))[0]:
            data = os.read(0, READ_SIZE)
            if not data:
                break
            writer.submit(decoder.feed(data))
            if decoder.bad_lines > writer.bad_lines:
                log.error("sink %s: %d lines from the relay were not events; dropped", spec.name, decoder.bad_lines)
                writer.bad_lines = decoder.bad_lines
        if time.monotonic() >= next_stats:
            send(writer.stats())
            next_stats = time.monotonic() + STATS_PERIOD
    writer.close(spec.drain_timeout)
    send(writer.stats())
    return 0


if __name__ == "__main__":
    sys.exit(child_main(SinkSpec(**json.loads(sys.argv[1]))))
