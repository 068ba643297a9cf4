"""Every sink but the journal runs in a child process of the relay, fed the journal's own lines.

A process, not a thread, because a sink busy in Python (Aim is) held the interpreter lock for up
to half of the ingest thread's time, so the journal's rate fell whenever a sink worked. In its own
process, at a lower CPU priority (``NICE``), a sink takes only what ingest leaves: under a burst the
journal keeps its rate and the sink catches up afterwards. A plugin that crashes or leaks takes
down only its own process, which is started again. And a sink gets exactly what ``relay replay``
would give it (events read back from their JSON lines, non-finite metrics restored).

Relay -> child, on stdin: journal lines. Child -> relay, one JSON object per line on the child's
own stdout: ``{"ready": true}`` or ``{"error": MESSAGE}`` once, then its counters every
``STATS_PERIOD`` and at exit. The sink's own stdout goes to stderr, which is the relay's log.

    python -m relay.sinkproc SPEC_JSON     (started by the relay, not by hand)
"""
from __future__ import annotations

import collections
import fcntl
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import click
import orjson

from relay.fanout import SinkWorker
from relay.schema import from_journal
from sinks.base import SinkContext, SinkError

log = logging.getLogger(__name__)

NICE = 19  # added to the relay's niceness (capped at 19): ingest first
STATS_PERIOD = 0.5
START_TIMEOUT = 120.0  # importing and opening a sink (Aim: creating a repository) on a busy machine
RESTART_MAX = 30.0  # seconds between attempts to start a crashed sink again, at most
READ_SIZE = 1 << 20
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux


@dataclass
class SinkSpec:
    """What a child needs to build its sink: the registry name and the sink's own CLI options."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    journal: str | None = None
    max_events: int = 200_000
    drain_timeout: float = 10.0
    log_level: str = "INFO"


class SinkProcess:
    """The relay's side of one child: ``submit`` never blocks ingest, counters merge the child's."""

    def __init__(self, spec: SinkSpec, ingest_idle: threading.Event | None = None) -> None:
        """``ingest_idle``, when given, is set while the relay's ingest thread waits for frames: lines
        go to the child only then (and at shutdown, when the relay sets it for good)."""
        self.spec = spec
        self.ingest_idle = ingest_idle
        self.name = spec.name
        self.dropped = 0  # here: queue full, or unconfirmed when a child died
        self.restarts = 0
        self._queue: collections.deque[tuple[bytes, int]] = collections.deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._proc: subprocess.Popen | None = None
        self._child: dict[str, Any] = {}  # the running child's last counters
        self._done = {"written": 0, "errors": 0, "dropped": 0}  # earlier children's
        self._sink_counters: dict[str, Any] | None = None  # the sink's own, as its child last said
        self._sent = 0  # events the running child was given
        self._answer: dict[str, Any] = {}  # the running child's first message: ready, or why not
        self._answered = threading.Event()  # set on that message, or when the child closed its output
        self._reader: threading.Thread | None = None
        self._feeder = threading.Thread(target=self._feed, name=f"sink-{self.name}", daemon=True)

    # -- the relay's calls -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the child and wait until its sink is open; SinkError if it cannot be."""
        self._spawn()
        self._feeder.start()

    def submit(self, lines: bytes, count: int) -> None:
        """Hand over ``count`` journal lines without waiting; dropped (counted) past the queue bound."""
        with self._cond:
            if self._queued + count > self.spec.max_events:
                self.dropped += count
                if self.dropped == count or self.dropped % 100_000 < count:
                    log.warning("sink %s is %d events behind; dropped %d so far (they are in the journal: "
                                "relay replay rebuilds it)", self.name, self._queued, self.dropped)
                return
            self._queue.append((lines, count))
            self._queued += count
            self._cond.notify()

    def stats(self) -> dict[str, Any]:
        child = self._child
        in_flight = max(0, self._sent - child.get("written", 0) - child.get("dropped", 0))
        out = {key: self._done[key] + child.get(key, 0) for key in ("written", "errors", "dropped")}
        out["dropped"] += self.dropped
        out["queued"] = self._queued + in_flight
        out["restarts"] = self.restarts
        if self._sink_counters is not None:
            out["sink"] = self._sink_counters
        return out

    def close(self, timeout: float) -> None:
        """Hand the child what is queued, let it drain (``spec.drain_timeout``), then stop it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._feeder.join(max(0.1, deadline - time.monotonic()))
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()) + self.spec.drain_timeout)
            except subprocess.TimeoutExpired:
                log.error("sink %s did not finish in time; stopping it", self.name)
                proc.kill()
                proc.wait()
            if self._reader is not None:
                self._reader.join(5.0)
            self._settle(proc.returncode, "at shutdown")
        if self._queued:
            self.dropped += self._queued
            log.error("sink %s: %d events not handed over at shutdown (they are in the journal: use relay "
                      "replay)", self.name, self._queued)

    # -- the child -------------------------------------------------------------------------------

    def _spawn(self) -> None:
        spec = json.dumps(asdict(self.spec))
        proc = subprocess.Popen([sys.executable, "-m", "relay.sinkproc", spec], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        _widen(proc.stdin)
        self._proc, self._child, self._sent = proc, {}, 0
        self._answer = {}
        self._answered.clear()
        self._reader = threading.Thread(target=self._read, args=(proc.stdout,), name=f"sink-{self.name}-stats",
                                         daemon=True)
        self._reader.start()
        self._answered.wait(START_TIMEOUT)
        first = self._answer
        if first.get("ready"):
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self._reader.join(5.0)
        self._proc = None
        raise SinkError(first.get("error") or f"sink {self.name} did not start (its process exited "
                                               f"{proc.returncode}); see the log above")

    def _read(self, stream: IO[bytes]) -> None:
        """The child's messages: the first answers start(), the rest are its counters."""
        try:
            for line in stream:
                try:
                    message = json.loads(line)
                except ValueError:
                    log.warning("sink %s: unreadable message from its process: %r", self.name, line[:200])
                    continue
                if not self._answered.is_set():
                    self._answer = message
                    self._answered.set()
                else:
                    self._child = message
                    self._sink_counters = message.get("sink", self._sink_counters)
        finally:
            self._answered.set()  # the child is gone: start() stops waiting

    def _feed(self) -> None:
        """Write queued lines to the child; start it again (with backoff) whenever it died."""
        backoff = 1.0
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    break
                lines, count = self._queue[0]
            if self._proc is None or self._proc.poll() is not None:
                if not self._restart(backoff):
                    return
                backoff = min(backoff * 2, RESTART_MAX)
                continue
            idle = self.ingest_idle
            while idle is not None and not idle.is_set():  # re-checked: a wait can end on a set already undone
                idle.wait()
            try:
                self._proc.stdin.write(lines)  # a pipe: blocks (without the GIL) while the child is busy
                self._proc.stdin.flush()
            except OSError:  # it died: reap it, and the next round starts another
                self._proc.wait()
                continue
            self._sent += count
            backoff = 1.0
            with self._cond:
                self._queue.popleft()
                self._queued -= count
        if self._proc is not None:
            try:
                self._proc.stdin.close()  # end of input: the child drains and exits
            except OSError:
                pass

    def _restart(self, backoff: float) -> bool:
        """Account for a dead child and start another after ``backoff``; False when stopping."""
        if self._proc is not None:
            self._proc.wait()
            if self._reader is not None:
                self._reader.join(5.0)
            self._settle(self._proc.returncode, "unexpectedly")
            self._proc = None
        with self._cond:
            self._cond.wait_for(lambda: self._stopping, backoff)
            if self._stopping:
                return False
        try:
            self._spawn()
        except SinkError as exc:
            self._done["errors"] += 1
            log.error("sink %s could not be started again (retrying in %.0f s): %s", self.name, backoff, exc)
            return True
        self.restarts += 1
        log.info("sink %s started again (pid %d)", self.name, self._proc.pid)
        return True

    def _settle(self, code: int | None, how: str) -> None:
        """Fold a finished child's counters in; what it was given but never confirmed is dropped."""
        child = self._child
        unconfirmed = max(0, self._sent - child.get("written", 0) - child.get("dropped", 0))
        for key in ("written", "errors", "dropped"):
            self._done[key] += child.get(key, 0)
        self._child, self._sent = {}, 0
        if code != 0 or unconfirmed:
            self._done["errors"] += 1 if code != 0 else 0
            self.dropped += unconfirmed
            log.error("sink %s's process exited %s (code %s); up to %d events it had not confirmed are dropped "
                      "for it (they are in the journal: relay replay rebuilds it)", self.name, how, code, unconfirmed)


def _widen(pipe: IO[bytes]) -> None:
    """Make the pipe to the child hold up to PIPE_SIZE: each write then moves thousands of lines, and
    the feeding thread takes the interpreter lock from ingest a few times a second, not hundreds."""
    try:
        fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, PIPE_SIZE)
    except OSError as exc:  # a lower system limit (fs.pipe-max-size): the default size still works
        log.debug("could not widen the pipe to a sink process: %s", exc)


# -- inside the child ------------------------------------------------------------------------------


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
    os.dup2(2, 1)  # whatever the sink prints goes to the log, not into the protocol

    def send(message: dict[str, Any]) -> None:
        os.write(channel, json.dumps(message).encode() + b"\n")

    logging.basicConfig(level=spec.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s [sink {spec.name} {os.getpid()}]: %(message)s")
    try:
        cls = load(spec.name)
        sink = cls(**_options(cls, spec.options))
        sink.open(SinkContext(journal=Path(spec.journal) if spec.journal else None))
    except SinkError as exc:
        send({"error": str(exc)})
        return 2
    except Exception as exc:  # a plugin's own bug: reported as the reason it could not start
        send({"error": f"sink {spec.name} failed to start: {type(exc).__name__}: {exc}"})
        return 2
    send({"ready": True})
    worker = SinkWorker(sink, spec.max_events)
    worker.start()
    pending = b""
    next_stats = time.monotonic() + STATS_PERIOD
    while True:
        if select.select([0], [], [], max(0.0, next_stats - time.monotonic()))[0]:
            data = os.read(0, READ_SIZE)
            if not data:
                break
            *complete, pending = (pending + data).split(b"\n")
            if complete:
                worker.submit([from_journal(orjson.loads(line)) for line in complete])
        if time.monotonic() >= next_stats:
            send(worker.stats())
            next_stats = time.monotonic() + STATS_PERIOD
    worker.close(spec.drain_timeout)
    send(worker.stats())
    return 0


if __name__ == "__main__":
    sys.exit(child_main(SinkSpec(**json.loads(sys.argv[1]))))
