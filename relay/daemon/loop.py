"""The relay daemon: the loop around one ROUTER socket that receives, journals, acknowledges and
fans out (docs/architecture.md, "One event's path" and "The data path").

One thread owns the socket and the journal; ingest (relay/daemon/ingest.py) and the commit step
(relay/daemon/commit.py) do the work. What is here is what needs the socket or the clock: who may
connect (the ZAP handler and refused handshakes, relay/daemon/gate.py), status requests (answered
from relay/daemon/status.py's budget), multipart rejection, whether a stream's owner is still
connected (relay/daemon/peers.py), the memory guard (relay/daemon/memory_guard.py), the timers
(counters, cross-rank checks, forgetting idle runs, the live status line) and shutdown. What it
holds between receiving and journaling is bounded in bytes (bounds.COMMIT_BYTES,
bounds.TURN_BYTES), not only in messages.
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import zmq

from relay.daemon import gate, listener, peers
from relay.daemon.bounds import TURN_BYTES, alive, raise_file_limit, trim_heap
from relay.daemon.commit import Acks
from relay.daemon.config import RelayConfig
from relay.daemon.counters import log_stats, write_stats
from relay.daemon.cross_rank import Cluster
from relay.daemon.ingest import Ingest
from relay.daemon.live_line import LiveLine
from relay.daemon.memory_guard import MemoryGuard, rebind
from relay.daemon.run_health import RunHealth
from relay.daemon.shutdown import Shutdown
from relay.daemon.status import STATUS_REQUEST, Answers, format_line
from relay.journal.deadletter import KEEP_BYTES, DeadLetters
from relay.journal.journal import NAME as JOURNAL, Journal
from relay.sinkhost.fan_out import FanOut
from relay.sinkhost.rate import Rate
from relay.sinkhost.spec import SinkSpec
from relay.wire import encoding
from relay.wire.address import check_bind_address, ensure_ipc_free
from sinks.base import SinkError
from sinks.files import write_atomic

log = logging.getLogger("relay")

RECV_BURST = 2000  # messages read per poll before the loop checks its timers
GC_THRESHOLD = 50_000  # allocations between young collections (Python's default: 700)


class Relay:
    """The socket and the loop around ``ingest`` (frames in) and its commit step (journal, acks,
    fan-out)."""

    def __init__(self, config: RelayConfig, journal: Journal, sinks: list[SinkSpec],
                 live: LiveLine | None = None) -> None:
        self.config = config
        self.journal = journal
        self.sinks = sinks
        now = time.monotonic()
        self.fan_out = FanOut()  # the other sinks' processes (none until open_sinks starts them)
        self.deadletters = DeadLetters(journal.sidecar("_deadletter.jsonl"))
        self.ingest = Ingest(journal, self.deadletters, now,
                             send_acks=self._send_acks, fan_out=self.fan_out.submit,
                             connected=self._connected, tell=self._tell,
                             run_rate=config.run_rate, max_runs=config.max_runs,
                             cluster=config.cluster)
        self.counters = self.ingest.counters
        self.stats_path: Path = journal.sidecar("_stats.json")
        self.address = config.address
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._gate: gate.Gate | None = None  # who may connect (relay/daemon/gate.py)
        self._policy: gate.Policy | None = None
        self._stop = False
        self._memory = MemoryGuard(config.max_memory, self.counters)
        self.live = live  # the status line on a terminal
        self._rate = Rate()
        self._answers = Answers(self.snapshot)
        self._journal_open = False
        # in the stats: relay status judges a relay of this host only
        self._host = socket.gethostname()
        #: called on this thread (the Prometheus endpoint's snapshot)
        self.each_second: list[Callable[[], None]] = []

    def bind(self) -> str:
        """Bind the socket; raises AddressInUse, BadAddress or gate.AuthError (the relay secret or a
        certificate cannot be used). Returns the actual endpoint."""
        transport = check_bind_address(self.config.address)
        if transport == "ipc":
            ensure_ipc_free(self.config.address)
        policy = self.check_gate()
        self._ctx = zmq.Context()
        # before the socket: no connection is ever admitted unasked
        self._gate = gate.Gate(self._ctx, policy)
        self._sock = self._listen(self.config.address)
        # only once it is true
        if (warning := gate.warning(policy, self.config.address)) is not None:
            log.warning("%s", warning)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.address

    def check_gate(self) -> gate.Policy:
        """Who may connect (the relay secret, made on first use, or certificates); gate.AuthError
        if they cannot be used. Called by bind(), or before anything is made (relay serve)."""
        if self._policy is None:
            self._policy = gate.policy(self.config)
        return self._policy

    def _listen(self, address: str) -> zmq.Socket:
        assert self._ctx is not None and self._gate is not None
        return listener.listen(self._ctx, address, self._gate)

    def open_journal(self) -> None:
        """Create the journal's folder and take its lock (once); JournalError if either fails."""
        if not self._journal_open:
            self.journal.open()
            self._journal_open = True

    def open_sinks(self) -> None:
        """Open the journal (if not yet), then start the others' processes without waiting for
        them: each opens its sink in its own time beside a relay that already listens, takes the
        lines that arrive meanwhile, and catches up from the journal (relay/sinkhost/process.py)."""
        self.open_journal()
        if self.fan_out.workers:
            return
        try:
            self.fan_out.start(self.sinks, self.journal, self.config.sink_queue,
                               self.config.shutdown_timeout,
                               None if self.live is None else self.live.write_above)
        except SinkError:  # a usage error: leave no lock (and no empty journal folder) behind
            self.journal.abandon()
            raise

    def write_ready_file(self) -> None:
        path = self.config.ready_file
        if path is None:
            return
        write_atomic(path, json.dumps({"address": self.address, "pid": os.getpid()}))

    def request_stop(self, *_: object) -> None:
        self._stop = True

    def serve(self) -> None:
        """Run until SIGINT/SIGTERM (or the watched process ends), then flush, ack and close."""
        assert self._sock is not None, "bind() first"
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        raise_file_limit()
        self.open_journal()
        # ready before the sinks open: they take seconds (Aim, MLflow), ingest none
        self.write_ready_file()
        if not self._stop:  # (a SIGTERM while it started: no sink is started only to be stopped)
            self.open_sinks()
        assert self._gate is not None
        log.info("relay listening on %s (%s), journal %s, sinks: %s", self.address,
                 self._gate.policy.describe(), self.journal.path,
                 ", ".join([JOURNAL] + [s.name for s in self.sinks]))
        poller = self._poller()
        # Events live from their frame to the next journal flush and never form cycles; at Python's
        # default thresholds the cyclic GC re-traverses them (and every module's objects) many times
        # over before they are freed. Freeze what start-up made, and collect young objects less
        # often.
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, 20, 20)
        interval = self.config.flush_interval
        ingest = self.ingest
        next_flush = time.monotonic() + interval
        next_stats = time.monotonic() + self.config.stats_interval
        next_watch = time.monotonic() + 1.0
        while not self._stop:
            now = time.monotonic()
            timeout = max(0.0, min(next_flush, next_watch) - now)
            if ingest.reading:
                if self._wait_for_frames(poller, timeout):
                    self._receive(self._sock)
            else:
                self.fan_out.idle.set()
                time.sleep(timeout)
                self.fan_out.idle.clear()
            now = time.monotonic()
            if now >= next_flush or ingest.full:
                self._refusals(now)
                ingest.commit(now)
                next_flush = now + interval
                if self._guard_memory():
                    poller = self._poller()
            if now >= next_stats:
                ingest.forget_idle(now - self.config.forget_after, now)
                snap = self.snapshot(self.config.stats_interval)
                if self.live is None:
                    log_stats(snap)
                write_stats(self.stats_path, snap)
                next_stats = now + self.config.stats_interval
            if now >= next_watch:
                next_watch = now + 1.0
                self._each_second(now)
                ingest.check(now)
                if self.config.watch_pid and not alive(self.config.watch_pid):
                    log.info("watched process %d is gone; shutting down", self.config.watch_pid)
                    self._stop = True
        self._shutdown()

    def _poller(self) -> zmq.Poller:
        """The socket, and the ZAP handler's requests (connections waiting to be admitted)."""
        assert self._sock is not None and self._gate is not None
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        if self._gate.zap is not None:
            poller.register(self._gate.zap, zmq.POLLIN)
        return poller

    def _wait_for_frames(self, poller: zmq.Poller, timeout: float) -> bool:
        """Poll; while that blocks, the other sinks' lines go to their processes. Under a burst the
        journal, the acks and the relay's CPU are all ingest's, and the sinks catch up after it.
        Connections waiting for the ZAP handler are answered here; True if frames wait."""
        assert self._sock is not None and self._gate is not None
        idle = self.fan_out.idle
        if not self.fan_out.workers or cast(int, self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            ready = dict(poller.poll(int(timeout * 1000)))
        else:
            idle.set()
            try:
                ready = dict(poller.poll(int(timeout * 1000)))
            finally:
                idle.clear()
        if self._gate.zap is not None and self._gate.zap in ready:
            self._gate.answer()
        return self._sock in ready

    def _receive(self, sock: zmq.Socket) -> None:
        """Read up to RECV_BURST messages or TURN_BYTES, and only until COMMIT_BYTES of lines wait
        for the journal (then the loop commits). Each is [peer, frame]; a message of more parts is
        rejected whole, read part by part so that the relay never holds more than one part of it."""
        now = time.monotonic()
        budget = TURN_BYTES
        ingest, take_frame = self.ingest, self.ingest.take_frame
        for _ in range(RECV_BURST):
            if budget <= 0 or ingest.full:
                return
            try:
                peer = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            frame = sock.recv()  # ZeroMQ delivers a message's parts together: the rest is here
            budget -= len(frame)
            if sock.getsockopt(zmq.RCVMORE):
                self._reject_multipart(sock, peer, frame)
            elif frame == STATUS_REQUEST:
                self._answer_status(sock, peer, now)
            else:
                take_frame(peer, frame, now)

    def _refusals(self, now: float) -> None:
        """Handshakes refused since the last look: counted, logged and dead-lettered
        (relay/daemon/gate.py)."""
        assert self._gate is not None
        for why in self._gate.refused():
            self.ingest.refuse_connection(why, now)

    def _connected(self, peer: bytes) -> bool:
        """Whether a stream owner ``peer`` is still connected (relay/daemon/peers.py)."""
        assert self._sock is not None
        return peers.connected(self._sock, peer)

    def _send_acks(self, peer: bytes, acks: Acks) -> None:
        assert self._sock is not None
        try:
            self._sock.send_multipart([peer, encoding.encode_ack(acks)], zmq.NOBLOCK)
            self.counters.acks_sent += 1
        except zmq.ZMQError:
            pass  # peer gone or slow: it resends, and gets a fresh ack then

    def _tell(self, peer: bytes, refused: list[tuple[str, int, str]]) -> None:
        """Tell a connection why its frames for these streams are refused (daemon/writers.py)."""
        assert self._sock is not None
        with contextlib.suppress(zmq.ZMQError):  # gone or slow: told again when it resends
            self._sock.send_multipart([peer, encoding.encode_refused(refused)], zmq.NOBLOCK)

    def _answer_status(self, sock: zmq.Socket, peer: bytes, now: float) -> None:
        """A status request: not a frame, never a reject; answered within status.py's budget."""
        reply = self._answers.reply(now)
        try:
            if reply is not None:
                sock.send_multipart([peer, reply], zmq.NOBLOCK)
                self.counters.status_answered += 1
                return
        except zmq.ZMQError:
            pass  # the peer is gone or not reading: counted below
        self.counters.status_unanswered += 1

    def _reject_multipart(self, sock: zmq.Socket, peer: bytes, first: bytes) -> None:
        self.counters.frames += 1
        kept, parts, size = [first[:KEEP_BYTES]], 1, len(first)
        while sock.getsockopt(zmq.RCVMORE):
            part = sock.recv(copy=False)
            parts += 1
            size += len(part)
            if sum(map(len, kept)) < KEEP_BYTES:
                kept.append(part.bytes[:KEEP_BYTES])
        self.ingest.reject("multipart", f"{parts} message parts ({size} bytes), expected 1",
                           b"".join(kept), peer)

    def _guard_memory(self) -> bool:
        """Past ``max_memory`` MiB (relay/daemon/memory_guard.py), every connection is dropped: the
        socket is closed and bound again, which frees what ZeroMQ held. True if that happened."""
        if not self._memory.exceeded():
            return False
        assert self._sock is not None and self._gate is not None
        self._gate.release(self._sock)
        self._sock.close(linger=0)
        self.ingest.all_peers_gone()
        self._sock = rebind(self._listen, self.address)
        trim_heap()
        return True

    def follow_health(self, health: RunHealth) -> Cluster | None:
        """Keep each run's health in ``health`` (the Prometheus endpoint, relay/metrics/); returns
        the cross-rank derivation the endpoint reads too (None without ``--cluster``)."""
        self.ingest.follow_health(health)
        return self.ingest.cluster

    def _each_second(self, now: float) -> None:
        """Sample what rates and lags are computed from; redraw the live line."""
        self._rate.sample(now, self.counters.events)
        self.fan_out.sample(now)
        for call in self.each_second:
            call()
        if self.live is not None:
            self.live.show(format_line(self.snapshot(), width=self.live.width()))

    def snapshot(self, window: float = 1.0, final: bool = False) -> dict[str, Any]:
        """Every counter, events/s over about the last ``window`` seconds, and the runs' ranks."""
        now = time.monotonic()
        runs = self.ingest.runs
        sinks: dict[str, Any] = {JOURNAL: self.ingest.journal_stats(now)}
        sinks.update(self.fan_out.stats())
        snap = self.counters.snapshot(sinks, runs.client_ranks())
        snap.update(ts=round(time.time(), 3), address=self.address, pid=os.getpid(),
                    host=self._host, final=final,
                    events_per_s=round(self._rate.per_s(now, self.counters.events, window), 1),
                    rate_window_s=window,
                    runs=runs.count(), active_window_s=self.config.active_window,
                    per_run=runs.view(now, self.config.active_window))
        return snap

    def _shutdown(self) -> None:
        if self.live is not None:  # the last live line stays on the terminal
            self.live.show(format_line(self.snapshot(), width=self.live.width()))
            self.live.close()
        shutdown = Shutdown(self.ingest, self.journal, self.deadletters, self.counters,
                            self.fan_out, self.sinks, self.config.shutdown_timeout, self.snapshot,
                            self.stats_path)
        shutdown.run(self.config.stats_interval)
        if self._sock is not None:
            if self._gate is not None:
                self._gate.release(self._sock)
            self._sock.close(linger=1000)
        if self._gate is not None:
            self._gate.close()
        if self._ctx is not None:
            self._ctx.term()
        if self.config.ready_file is not None:
            self.config.ready_file.unlink(missing_ok=True)

