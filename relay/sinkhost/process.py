"""The relay's side of a sink's or shipper's process (relay/sinkhost/child.py; docs/relay.md, "What
the relay does with an event", step 3).

A process, not a thread, because a sink busy in Python (Aim is) held the interpreter lock for up
to half of the ingest thread's time; at nice 19 it takes only what ingest leaves, and a plugin that
crashes or leaks takes down only its own process. ``queued`` and ``lag_s`` come from the ingest
thread's own count of what it handed over, sampled every second (``sample``).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import IO, Any

from relay.journal.journal_queue import News
from relay.ship.base import is_shipper, load
from relay.sinkhost import notices
from relay.sinkhost.batch_queue import BatchWorker
from relay.sinkhost.counts import ChildCounts
from relay.sinkhost.lifeline import kill, spawn
from relay.sinkhost.rate import Rate
from relay.sinkhost.spec import SinkSpec
from sinks.base import SinkError

__all__ = ["SinkProcess"]

log = logging.getLogger(__name__)

#: Journal lines the relay keeps for one other sink's process (beside --sink-queue events): a sink
#: that falls further behind has batches dropped, counted, which it reads back from the journal.
SINK_QUEUE_BYTES = 64 << 20

#: Importing and opening a sink (Aim: creating a repository; MLflow: creating a database, whose
#: migrations took over 120 s at load 16 on 2 cores). The relay does not wait for it; only a child
#: still opening after this long is taken as hung (and started again). A child killed in the middle
#: of it leaves the store as it was (sinks/store_setup.py): the next one sets it up.
START_TIMEOUT = 600.0
RESTART_START = 1.0  # seconds before the first attempt to start a crashed sink again
RESTART_MAX = 30.0  # at most, doubling while it keeps failing
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux


class SinkProcess:
    """The relay's side of one child: ``submit`` never blocks ingest, counters merge the child's."""

    def __init__(self, spec: SinkSpec, ingest_idle: threading.Event | None = None,
                 stderr: Callable[[bytes], None] | None = None) -> None:
        """``ingest_idle``, when given, is set while the relay's ingest thread waits for frames:
        lines go to the child only then (and at shutdown, when the relay sets it for good); the
        notices for a shipper, a few bytes each, go at once, so it reads the journal while a burst
        goes on (in its own process, at nice 19: on CPU ingest leaves). ``stderr``, when given, gets
        the child's stderr line by line (else it shares the relay's)."""
        #: a shipper is sent only the news of each write (relay/sinkhost/notices.py), not its lines
        self.ships = is_shipper(load(spec.source or spec.name))
        self.spec = spec
        self.ingest_idle = ingest_idle
        self.stderr = stderr
        self.name = spec.name
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._child = ChildCounts()  # the running child's last counters
        self._done = ChildCounts()  # earlier children's
        self._lost = 0  # given to a child that died before confirming them
        self._sink_counters: dict[str, Any] | None = None  # the sink's own, as its child last said
        self._sent = 0  # events the running child was given
        self._answer: dict[str, Any] = {}  # the running child's first message: ready, or why not
        #: set on that message, or when the child closed its output
        self._answered = threading.Event()
        self._reader: threading.Thread | None = None
        self._backoff = RESTART_START
        #: set once the first child opened its sink (or when stopping)
        self._opened = threading.Event()
        self._opener: threading.Thread | None = None
        # set at shutdown: a child still opening with nothing to apply stops
        self._give_up = threading.Event()
        self.opened = False  # whether a child has opened the sink yet
        self.open_failures = 0  # attempts to open the sink that failed
        self.open_error: str | None = None  # why the last one failed, while the sink is not open
        #: once closed: whether the sink applied every event it was handed (None while it runs)
        self.complete: bool | None = None
        self._submitted = 0  # events handed to submit(), by the ingest thread
        #: that count sampled every second, to date the oldest event not yet confirmed
        self._handed = Rate()
        self._worker: BatchWorker[tuple[bytes, int]] = BatchWorker(
            spec.name, self._hand_over, spec.max_events, finish=self._end_input,
            max_bytes=SINK_QUEUE_BYTES)

    # Called by the relay's threads.

    def start(self) -> None:
        """Start the child beside the relay, without waiting: lines queue (bounded) until its sink
        is open. A sink that cannot open is counted and tried again with backoff from RESTART_START
        to RESTART_MAX seconds for as long as the relay runs; what can never work was refused before
        it listened."""
        self._worker.start()
        self._opener = threading.Thread(target=self._open_first, name=f"sink-{self.name}-open",
                                        daemon=True)
        self._opener.start()

    def _open_first(self) -> None:
        backoff = RESTART_START
        try:
            while True:
                try:
                    self._spawn()
                except SinkError as exc:
                    if self._worker.stopping:  # the relay stopped while it was opening
                        log.warning("sink %s stopped before it had opened: %s", self.name, exc)
                        return
                    self.open_failures += 1
                    self._done += ChildCounts(errors=1)
                    self.open_error = str(exc)
                    log.error("sink %s could not open (%d attempts; trying again in %.0f s, its "
                              "events wait in the journal): %s", self.name, self.open_failures,
                              backoff, exc)
                    if not self._worker.wait(backoff, drain=False):
                        return
                    backoff = min(backoff * 2, RESTART_MAX)
                    continue
                self.open_error, self.opened = None, True
                log.info("sink %s open (pid %d)", self.name, self._pid())
                return
        finally:
            self._opened.set()

    def submit(self, lines: bytes, count: int) -> None:
        """Hand over ``count`` journal lines without waiting; dropped (counted) past the queue
        bound."""
        self._submitted += count
        self._worker.submit((lines, count), count, len(lines))

    def ship(self, news: News) -> None:
        """A shipper's share of a journal write: its news, as ``submit`` hands over lines."""
        notice = notices.encode(news)
        count = sum(events for events, _ in news.values())
        self._submitted += count
        self._worker.submit((notice, count), count, len(notice))

    def sample(self, now: float) -> None:
        """Note how many events were handed over by now (the relay calls this every second)."""
        self._handed.sample(now, self._submitted)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = (self._done + self._child).as_dict()
        out["dropped"] += self._worker.dropped + self._lost
        out["queued"] = self._worker.queued + self._in_flight()
        out["lag_s"] = self._lag(out["queued"])
        out["restarts"] = self.restarts
        out["open"] = self.opened
        if self.open_failures:
            out["open_failures"] = self.open_failures
        if self.open_error is not None:
            out["open_error"] = self.open_error
        if self._sink_counters is not None:
            out["sink"] = self._sink_counters
        if self.complete is not None:
            out["complete"] = self.complete
        return out

    def close(self, timeout: float) -> None:
        """Hand the child what is queued and let it drain, all within ``timeout`` seconds; a child
        still opening or draining then is stopped (it would die with the relay anyway). What it had
        not applied counts as dropped, and ``complete`` says whether it applied everything and
        closed completely."""
        deadline = time.monotonic() + timeout
        self._worker.stop(timeout)
        # it was handed nothing: no reason to wait for its open
        if not self.opened and self._submitted == 0:
            self._give_up.set()
            log.info("sink %s was still opening and had been handed nothing: stopped (it catches "
                     "up from the journal when a relay next opens it)", self.name)
        if self._opener is not None:
            self._opener.join(max(0.0, deadline - time.monotonic()))
            if self._opener.is_alive():
                left = self._worker.abandon()
                self.complete = False
                log.warning("sink %s is still opening at shutdown; its process stops with the "
                            "relay. %d events were not handed to it: they are in the journal (a "
                            "sink that catches up reads them there; relay replay rebuilds any "
                            "sink)", self.name, left)
                return
        self._worker.join(max(0.1, deadline - time.monotonic()))
        proc = self._proc
        exited = False
        if proc is not None:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
                exited = proc.returncode == 0
            except subprocess.TimeoutExpired:
                log.error("sink %s did not finish within the shutdown timeout (%.0f s); stopping "
                          "it", self.name, timeout)
                kill(proc)
                proc.wait()
            if self._reader is not None:
                self._reader.join(5.0)
            self._settle(proc.returncode, "at shutdown")
        left = self._worker.abandon()
        if left:
            log.error("sink %s: %d events not handed over at shutdown (they are in the journal: "
                      "use relay replay)", self.name, left)
        stats = self.stats()
        gave_up = self._give_up.is_set() and not self.opened  # handed nothing, so it lacks nothing
        self.complete = ((exited or gave_up) and stats["dropped"] == 0
                         and stats["incomplete_closes"] == 0)

    def _lag(self, queued: int) -> float:
        """Seconds since the oldest event still queued was handed over, to the sampling period: at
        least that long ago the count handed over first passed what the sink has confirmed."""
        if not queued:
            return 0.0
        since = self._handed.since(self._submitted - queued)
        return 0.0 if since is None else round(time.monotonic() - since, 1)

    # Run on the worker's thread.

    def _hand_over(self, chunk: tuple[bytes, int]) -> bool:
        """Write one chunk of lines to the child, once ingest is idle; start the child again (with
        backoff) whenever it died. False when shutting down before it could be."""
        lines, count = chunk
        self._opened.wait()
        while True:
            if self._proc is None or self._proc.poll() is not None:
                if not self._restart():
                    return False
                continue
            idle = None if self.ships else self.ingest_idle  # a notice, a few bytes, need not wait
            # re-checked: a wait can end on a set already undone
            while idle is not None and not idle.is_set():
                idle.wait()
            try:
                # a pipe: blocks (without the GIL) while the child is busy
                self._stdin().write(lines)
                self._stdin().flush()
            except OSError:  # it died: reap it, and the next round starts another
                self._proc.wait()
                continue
            self._sent += count
            self._backoff = RESTART_START
            return True

    def _end_input(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._stdin().close()  # end of input: the child drains and exits

    def _restart(self) -> bool:
        """Account for a dead child and start another after the backoff; False when stopping."""
        if self._proc is not None:
            self._proc.wait()
            if self._reader is not None:
                self._reader.join(5.0)
            self._settle(self._proc.returncode, "unexpectedly")
            self._proc = None
        if not self._worker.wait(self._backoff, drain=False):
            return False
        self._backoff = min(self._backoff * 2, RESTART_MAX)
        try:
            self._spawn()
        except SinkError as exc:
            self._done += ChildCounts(errors=1)
            log.error("sink %s could not be started again (retrying in %.0f s): %s", self.name,
                      self._backoff, exc)
            return True
        self.restarts += 1
        log.info("sink %s started again (pid %d)", self.name, self._pid())
        return True

    def _pid(self) -> int:
        return -1 if self._proc is None else self._proc.pid

    def _stdin(self, proc: subprocess.Popen | None = None) -> IO[bytes]:
        """The pipe to the child, which _spawn starts with stdin=PIPE before anything is written."""
        proc = proc or self._proc
        if proc is None or proc.stdin is None:
            raise OSError("the sink process has no input pipe")  # handled as the child having died
        return proc.stdin

    def _spawn(self) -> None:
        spec = json.dumps(asdict(self.spec))
        proc = spawn(f"sink {self.name}", "relay.sinkhost.child", [spec], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE,
                     stderr=None if self.stderr is None else subprocess.PIPE)
        if self.stderr is not None:
            threading.Thread(target=self._pass_stderr, args=(proc.stderr,),
                             name=f"sink-{self.name}-stderr", daemon=True).start()
        _widen(self._stdin(proc))
        self._proc, self._child, self._sent = proc, ChildCounts(), 0
        self._answer = {}
        self._answered.clear()
        self._reader = threading.Thread(target=self._read, args=(proc.stdout,),
                                        name=f"sink-{self.name}-stats", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + START_TIMEOUT
        while (not self._answered.wait(0.1) and not self._give_up.is_set()
               and time.monotonic() < deadline):
            pass
        first = self._answer
        if first.get("ready"):
            return
        if proc.poll() is None:
            kill(proc)
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
                    log.warning("sink %s: unreadable message from its process: %r", self.name,
                                line[:200])
                    continue
                if not self._answered.is_set():
                    self._answer = message
                    self._answered.set()
                else:
                    self._child = ChildCounts.of(message)
                    self._sink_counters = message.get("sink", self._sink_counters)
        finally:
            self._answered.set()  # the child is gone: start() stops waiting

    def _pass_stderr(self, stream: IO[bytes]) -> None:
        """The child's stderr (its log), line by line, to ``self.stderr`` until the child closes
        it."""
        assert self.stderr is not None
        with stream:
            for line in stream:
                self.stderr(line)

    def _in_flight(self) -> int:
        """Events the running child was given and has not yet confirmed."""
        return max(0, self._sent - self._child.resolved)

    def _settle(self, code: int | None, how: str) -> None:
        """Fold a finished child's counters in; what it was given but never confirmed is dropped."""
        unconfirmed = self._in_flight()
        self._done += self._child
        self._child, self._sent = ChildCounts(), 0
        if code != 0 or unconfirmed:
            self._done += ChildCounts(errors=1 if code != 0 else 0)
            self._lost += unconfirmed
            log.error("sink %s's process exited %s (code %s); up to %d events it had not "
                      "confirmed are dropped for it (they are in the journal: relay replay "
                      "rebuilds it)", self.name, how, code, unconfirmed)


def _widen(pipe: IO[bytes]) -> None:
    """Make the pipe to the child hold up to PIPE_SIZE: each write then moves thousands of lines,
    and the feeding thread takes the interpreter lock from ingest a few times a second, not
    hundreds."""
    try:
        fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, PIPE_SIZE)
    except OSError as exc:  # a lower system limit (fs.pipe-max-size): the default size still works
        log.debug("could not widen the pipe to a sink process: %s", exc)
