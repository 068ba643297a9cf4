"""The relay daemon: receive, validate, de-duplicate, journal, acknowledge, fan out.

One ingest thread owns the ROUTER socket and the journal (relay/journal/journal.py). Every
``flush_interval`` it appends the new events to the journal in one write, then acknowledges
cumulatively per (run, rank), then hands the same lines to each other sink's process
(relay/sinkhost/process.py). Acks therefore mean "in the journal", and no other sink can slow ingest down.
Every second it samples its counters for rates and sink lag, and on a terminal redraws the live
status line; a status request on the socket is answered from relay/daemon/status.py's budget.
From every rank's step times it derives cross-rank events of its own (relay/daemon/cross_rank.py), journaled
and fanned out the same way as rank RELAY_RANK.

It runs over 350 lines because what is here is the one ingest thread's state (routes, dedupe,
pending lines, acks due) and every step that touches it per frame or per flush; the parts that
stand alone are in relay/daemon/bounds.py (run budget, byte budgets, memory, descriptors), relay/journal/journal.py
and relay/journal/dedupe.py. What it holds between receiving and journaling is bounded in bytes
(limits.COMMIT_BYTES, limits.TURN_BYTES), not only in messages.
"""
from __future__ import annotations

import errno
import gc
import json
import logging
import operator
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

import zmq

from relay.wire import curve, encoding, schema

from relay.daemon import peers
from relay.wire.address import AddressInUse, BadAddress, check_bind_address, ensure_ipc_free, is_loopback
from relay.daemon.cross_rank import Cluster, ClusterConfig, Derived
from relay.journal.deadletter import KEEP_BYTES, DeadLetters
from relay.journal.dedupe import Dedupe, RankState, claimed_drop
from relay.journal.journal import NAME as JOURNAL, Journal
from relay.wire.lines import check_lines, encode_line, encode_lines
from relay.daemon.bounds import COMMIT_BYTES, RECV_HWM, TURN_BYTES, MemoryProbe, RunBudget, alive, raise_file_limit, trim_heap
from relay.daemon.live_line import LiveLine
from relay.sinkhost.child import SinkSpec
from relay.sinkhost.process import SinkProcess
from relay.daemon.counters import Counters, log_stats, run_view, write_stats
from relay.sinkhost.rate import Rate
from relay.daemon.status import STATUS_REQUEST, Answers, format_line
from sinks.base import SinkError
from sinks.events import RELAY_RANK
from sinks.files import write_atomic

log = logging.getLogger("relay")

RECV_BURST = 2000  # messages read per poll before the loop checks its timers
MAX_UNJOURNALED = 200_000  # stop reading (clients keep their events) while the journal is failing
GC_THRESHOLD = 50_000  # allocations between young collections (Python's default: 700)
REBIND_TIMEOUT = 5.0  # seconds to get the address back after dropping every connection
_rank = operator.itemgetter("rank")


@dataclass
class RelayConfig:
    address: str
    flush_interval: float = 0.05
    stats_interval: float = 30.0
    sink_queue: int = 200_000
    ready_file: Path | None = None
    watch_pid: int | None = None
    curve_cert: Path | None = None
    curve_clients: Path | None = None
    shutdown_timeout: float = 10.0
    forget_after: float = 3600.0
    #: new run ids one connection may start per minute (and at once): a flood beyond is refused
    run_rate: float = 60.0
    #: runs whose dedupe state is kept in memory; past it the least recently active is forgotten
    max_runs: int = 10_000
    #: MiB of resident memory at which every connection is dropped (see _guard_memory); 0: never
    max_memory: int = 1024
    #: seconds after its last frame a rank still counts as connected in the status
    active_window: float = 60.0
    #: cross-rank events derived from the ranks' step times (relay/daemon/cross_rank.py); None: none
    cluster: ClusterConfig | None = field(default_factory=ClusterConfig)


class Relay:
    def __init__(self, config: RelayConfig, journal: Journal, sinks: list[SinkSpec]) -> None:
        self.config = config
        self.journal = journal
        self.sinks = sinks
        self.counters = Counters()
        self.dedupe = Dedupe()
        self.deadletters = DeadLetters(journal.sidecar("_deadletter.jsonl"))
        self.stats_path: Path = journal.sidecar("_stats.json")
        self.workers: list[SinkProcess] = []
        self.address = config.address
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None  # the socket's disconnections (relay/daemon/peers.py)
        self._connections = peers.Connections()
        self._peer_frame: zmq.Frame | None = None  # the routing id of the message being taken
        self._auth: curve.ThreadAuthenticator | None = None
        self._stop = False
        self._ingest_idle = threading.Event()  # set while ingest waits for frames: the sinks get lines then
        # Accepted events as (run, journal lines) chunks, encoded on arrival while they are still in
        # the CPU's cache; the other sinks get the same lines.
        self._lines: list[tuple[str, bytes]] = []
        self._pending = 0  # events in self._lines
        self._pending_bytes = 0  # bytes in self._lines
        self._acks_due: set[tuple[str, int]] = set()  # acks go to each stream's owner (relay/journal/dedupe.py)
        self._hellos: dict[tuple[str, int], float] = {}  # ts of each rank's hello, to spot reused run ids
        self._run_budget = RunBudget(config.run_rate)  # new runs each connection may start
        self._journal_backoff = 0.0
        self._journal_retry_at = 0.0
        self._memory = MemoryProbe()
        self.live: LiveLine | None = None  # the status line on a terminal (set before open_sinks)
        self._active: dict[tuple[str, int], float] = {}  # each rank's last frame, for "ranks connected"
        self._world: dict[str, int] = {}  # each run's world size
        self._rate = Rate()
        self._answers = Answers(self.snapshot)
        self._journal_ok_at = time.monotonic()  # the last journal write that worked
        self.cluster = Cluster(config.cluster) if config.cluster is not None else None
        self._host = socket.gethostname()
        self._derived_runs: set[str] = set()  # runs with derived events not journaled yet
        self._journal_open = False

    # -- setup -----------------------------------------------------------------------------------

    def bind(self) -> str:
        """Bind the socket; raises AddressInUse or BadAddress. Returns the actual endpoint."""
        transport = check_bind_address(self.config.address)
        if transport == "ipc":
            ensure_ipc_free(self.config.address)
        self._ctx = zmq.Context()
        self._sock = self._listen(self.config.address)
        if self.config.curve_cert is None and not is_loopback(self.config.address):  # only once it is true
            log.warning("listening on %s without encryption or authentication: anyone who can reach it can "
                        "publish; use --curve-cert (see docs/security.md)", self.config.address)
        self._monitor = peers.watch(self._sock)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.address

    def _listen(self, address: str) -> zmq.Socket:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.MAXMSGSIZE, schema.MAX_TRANSPORT_BYTES)
        sock.setsockopt(zmq.RCVHWM, RECV_HWM)  # per peer: bounds what ZeroMQ buffers for us
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.LINGER, 1000)
        if self.config.curve_cert is not None:
            try:
                auth = curve.secure_server(self._ctx, sock, self.config.curve_cert, self.config.curve_clients)
            except ValueError as exc:
                sock.close(0)
                raise BadAddress(str(exc)) from None
            self._auth = self._auth or auth
        try:
            sock.bind(address)
        except zmq.ZMQError as exc:
            sock.close(0)
            if exc.errno == errno.EADDRINUSE:
                raise AddressInUse(f"{address} is already in use (another relay?)") from None
            raise BadAddress(f"cannot bind {address}: {exc}; give an address of this machine "
                             "(tcp://127.0.0.1:PORT, tcp://0.0.0.0:PORT for every interface) or ipc:///PATH") from None
        return sock

    def open_journal(self) -> None:
        """Create the journal's folder and take its lock (once); JournalError if either cannot be."""
        if not self._journal_open:
            self.journal.open()
            self._journal_open = True

    def open_sinks(self) -> None:
        """Open the journal (if not yet), then start the others' processes without waiting for
        them: each opens its sink in its own time beside a relay that already listens, takes the
        lines that arrive meanwhile, and catches up from the journal (relay/sinkhost/process.py)."""
        self.open_journal()
        if self.workers:
            return
        journal = self.journal
        where = str(journal.path) + (os.sep if journal.directory else "")
        try:
            for spec in self.sinks:
                deadletter = journal.sidecar(f"_deadletter_{spec.name}.jsonl")
                worker = SinkProcess(replace(spec, journal=where, deadletter=str(deadletter),
                                             max_events=self.config.sink_queue,
                                             drain_timeout=self.config.shutdown_timeout), self._ingest_idle,
                                     None if self.live is None else self.live.write_above)
                worker.start()
                self.workers.append(worker)
        except SinkError:  # a usage error: leave no lock (and no empty journal folder) behind
            journal.abandon()
            raise

    def write_ready_file(self) -> None:
        path = self.config.ready_file
        if path is None:
            return
        write_atomic(path, json.dumps({"address": self.address, "pid": os.getpid()}))

    # -- the loop ---------------------------------------------------------------------------------

    def request_stop(self, *_: object) -> None:
        self._stop = True

    def serve(self) -> None:
        """Run until SIGINT/SIGTERM (or the watched process ends), then flush, ack and close."""
        assert self._sock is not None, "bind() first"
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        raise_file_limit()
        self.open_journal()
        self.write_ready_file()  # ready before the sinks open: they take seconds (Aim, MLflow), ingest none
        self.open_sinks()
        log.info("relay listening on %s, journal %s, sinks: %s", self.address,
                 self.journal.path,
                 ", ".join([JOURNAL] + [s.name for s in self.sinks]))
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        # Events live from their frame to the next journal flush and never form cycles; at Python's
        # default thresholds the cyclic GC re-traverses them (and every module's objects) many times
        # over before they are freed. Freeze what start-up made, and collect young objects less often.
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, 20, 20)
        interval = self.config.flush_interval
        next_flush = time.monotonic() + interval
        next_stats = time.monotonic() + self.config.stats_interval
        next_watch = time.monotonic() + 1.0
        while not self._stop:
            now = time.monotonic()
            reading = self._pending < MAX_UNJOURNALED and self._pending_bytes < COMMIT_BYTES
            timeout = max(0.0, min(next_flush, next_watch) - now)
            if reading:
                if self._wait_for_frames(poller, timeout):
                    self._receive(self._sock)
            else:
                self._ingest_idle.set()
                time.sleep(timeout)
                self._ingest_idle.clear()
            now = time.monotonic()
            if now >= next_flush or self._pending_bytes >= COMMIT_BYTES:
                self._peers_gone()
                self.commit()
                next_flush = now + interval
                if self._guard_memory():
                    poller = zmq.Poller()
                    poller.register(self._sock, zmq.POLLIN)
            if now >= next_stats:
                self._forget_idle(now - self.config.forget_after)
                snap = self.snapshot(self.config.stats_interval)
                if self.live is None:
                    log_stats(snap)
                write_stats(self.stats_path, snap)
                next_stats = now + self.config.stats_interval
            if now >= next_watch:
                next_watch = now + 1.0
                self._each_second(now)
                if self.cluster is not None:
                    self._publish(self.cluster.check(now))
                if self.config.watch_pid and not alive(self.config.watch_pid):
                    log.info("watched process %d is gone; shutting down", self.config.watch_pid)
                    self._stop = True
        self._shutdown()

    def _wait_for_frames(self, poller: zmq.Poller, timeout: float) -> bool:
        """Poll; while that blocks, the other sinks' lines go to their processes. Under a burst the
        journal, the acks and the relay's CPU are all ingest's, and the sinks catch up after it."""
        assert self._sock is not None
        if not self.workers or self._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return bool(poller.poll(timeout * 1000))
        self._ingest_idle.set()
        try:
            return bool(poller.poll(timeout * 1000))
        finally:
            self._ingest_idle.clear()

    def _receive(self, sock: zmq.Socket) -> None:
        """Read up to RECV_BURST messages or TURN_BYTES, and only until COMMIT_BYTES of lines wait
        for the journal (then the loop commits). Each is [peer, frame]; a message of more parts is
        rejected whole, read part by part so that the relay never holds more than one part of it."""
        now = time.monotonic()
        budget = TURN_BYTES
        for _ in range(RECV_BURST):
            if budget <= 0 or self._pending_bytes >= COMMIT_BYTES:
                return
            try:
                self._peer_frame = part = sock.recv(zmq.NOBLOCK, copy=False)  # (its descriptor: relay/daemon/peers.py)
            except zmq.Again:
                return
            peer = part.bytes
            frame = sock.recv()  # ZeroMQ delivers a message's parts together: the rest is here
            budget -= len(frame)
            if sock.getsockopt(zmq.RCVMORE):
                self._reject_multipart(sock, peer, frame)
            elif frame == STATUS_REQUEST:
                self._answer_status(sock, peer, now)
            else:
                self.take_frame(peer, frame, now)

    def _peers_gone(self) -> None:
        """The streams of owners whose connections closed pass to whichever connection sends for
        them next: their reconnection (relay/daemon/peers.py)."""
        if self._monitor is None:
            return
        for fd in peers.closed_fds(self._monitor):
            self._peer_gone(self._connections.closed(fd))

    def _peer_gone(self, peer: bytes | None) -> None:
        released = self.dedupe.release(peer) if peer is not None else 0
        if released:
            self.counters.owners_released += released
            log.debug("peer %s disconnected: %d streams it sent are free", peer.hex(), released)

    def _answer_status(self, sock: zmq.Socket, peer: bytes, now: float) -> None:
        """A status request: not a frame, never a reject; answered within relay/daemon/status.py's budget."""
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
        self._reject("multipart", f"{parts} message parts ({size} bytes), expected 1", b"".join(kept), peer)

    def take_frame(self, peer: bytes, frame: bytes, now: float | None = None) -> None:
        """One client message: validated, de-duplicated and queued for the journal, or rejected
        with a counted reason. Never raises: whatever one frame does, ingest goes on; an error this
        code did not foresee is logged, counted as ``internal_error`` and the frame dead-lettered,
        and since nothing of it was acknowledged its client sends it again."""
        self.counters.frames += 1
        try:
            events, first_seq, derive = schema.decode(frame)
        except schema.FrameError as exc:
            self._reject(exc.reason, exc.detail, frame, peer)
            return
        if (events[0]["rank"] if first_seq is not None else max(map(_rank, events))) == RELAY_RANK:
            self._reject("reserved_rank", f"rank {RELAY_RANK} is the relay's own (the events it derives); "
                                          "no client may publish as it", frame, peer)
            return
        now = time.monotonic() if now is None else now
        taken = self._owned_elsewhere(peer, events, first_seq, now)
        if taken is not None:
            self._reject("not_owner", f"run {taken[0]} rank {taken[1]} is being sent by another live connection; "
                                      "refused until that one disconnects", frame, peer)
            return
        try:
            self._take_events(peer, events, first_seq, now, derive)
            run = events[0]["run"]
            if run not in self._world and run in self.dedupe.run_ranks:  # (for the status)
                self._world[run] = events[0]["world_size"]
        except schema.FrameError as exc:  # its journal lines would be too long (check_lines)
            self._reject(exc.reason, exc.detail, frame, peer)
        except Exception as exc:  # counted and dead-lettered below; one frame never stops ingest
            log.exception("frame from peer %s raised; dead-lettered", peer.hex())
            self._reject("internal_error", f"{type(exc).__name__}: {exc}", frame, peer)

    def _owned_elsewhere(self, peer: bytes, events: list[dict[str, Any]], first_seq: int | None,
                         now: float) -> tuple[str, int] | None:
        """The first (run, rank) of the frame that another live connection owns; None if none does."""
        ranks = self.dedupe.ranks
        if first_seq is not None:
            keys: Iterable[tuple[str, int]] = ((events[0]["run"], events[0]["rank"]),)
        else:
            keys = {(e["run"], e["rank"]) for e in events}
        for key in keys:
            state = ranks.get(key)
            if state is not None and state.foreign(peer, now):
                return key
        return None

    def _take_events(self, peer: bytes, events: list[dict[str, Any]], first_seq: int | None, now: float,
                     derive: bool) -> None:
        counters = self.counters
        if first_seq is not None:  # one rank's plain events, seqs without a gap: maybe all new
            run, rank = events[0]["run"], events[0]["rank"]
            chunk = encode_lines(events)
            check_lines(chunk)
            state = self._state(peer, run, rank, now)
            if state is None:
                self._refuse_runs(peer, [run], events)
                return
            counters.events += len(events)
            if state.take_run(first_seq, len(events)):
                self._lines.append((run, chunk))  # (not bound before _state: making room may commit)
                self._pending += len(events)
                self._pending_bytes += len(chunk)
                if derive and self.cluster is not None:
                    self._derive(events, now)
                return
            lines = None
        else:
            lines = [encode_line(event) for event in events]
            check_lines(lines)
            new = {e["run"] for e in events}.difference(self.dedupe.run_ranks)
            if new and not self._run_budget.admit(peer, len(new), now):
                self._refuse_runs(peer, sorted(new), events)
                return
            counters.events += len(events)
        last_key = None
        for event, line in zip(events, lines or map(encode_line, events)):
            key = (event["run"], event["rank"])
            if key != last_key:  # a frame normally holds one rank's events: look it up once
                state = self._state(peer, key[0], key[1], now, admitted=True)
                last_key = key
            if state.take(event["seq"], peer):
                self._lines.append((key[0], line))
                self._pending += 1
                self._pending_bytes += len(line)
                if event["type"] == "stats":
                    self._client_drops(key, state, event, peer)
                elif event["type"] == "hello":
                    self._hellos[key] = event["ts"]
                elif self.cluster is not None and (event["stage"] == "rank" or event["type"] == "lifecycle"):
                    self._derive((event,), now)
            else:
                counters.duplicates += 1
                if event["type"] == "hello" and self._hellos.get(key, event["ts"]) != event["ts"]:
                    self._reused_run(key)

    def _derive(self, events: Iterable[dict[str, Any]], now: float) -> None:
        """Hand the new per-rank figures and lifecycle events among ``events`` to the cluster derivation."""
        cluster = self.cluster
        assert cluster is not None
        for event in events:
            if event["stage"] == "rank" and event["type"] == "metrics":
                self._publish(cluster.observe(event, now))
            elif event["type"] == "lifecycle":
                cluster.ended(event, now)

    def _publish(self, derived: list[Derived]) -> None:
        """The relay's own events go where every taken event goes, numbered on from what the journal
        holds of (run, RELAY_RANK); no one is acknowledged for them."""
        for item in derived:
            state = self.dedupe.lookup(item.run, RELAY_RANK, self.journal)
            seq = state.floor
            state.take(seq)
            event = {"v": schema.SCHEMA_VERSION, "run": item.run, "rank": RELAY_RANK, "local_rank": 0,
                     "world_size": item.world_size, "host": self._host, "seq": seq, "ts": time.time(),
                     "type": item.type, "step": item.step, "epoch": item.epoch, "stage": "cluster",
                     "data": item.data}
            line = encode_line(event)
            self._lines.append((item.run, line))
            self._pending += 1
            self._pending_bytes += len(line)
            self.counters.derived += 1
            self._derived_runs.add(item.run)

    def _state(self, peer: bytes, run: str, rank: int, now: float, admitted: bool = False) -> RankState | None:
        """(run, rank)'s dedupe state, with its ack route and activity noted; None if ``run`` is new
        and ``peer`` has used up its budget of new runs (unless already ``admitted``)."""
        dedupe = self.dedupe
        key = (run, rank)
        state = dedupe.ranks.get(key)
        if state is None:
            new = run not in dedupe.run_ranks
            if new:
                if not admitted and not self._run_budget.admit(peer, 1, now):
                    return None
                self._make_room()
            state = dedupe.lookup(run, rank, self.journal)
            if new and self.cluster is not None and (state.floor or state.above or len(dedupe.run_ranks[run]) > 1):
                self.cluster.restore(self.journal.recent(run), now)  # met again: a restart, or forgotten
        if dedupe.claim(key, state, peer, now) and self._peer_frame is not None:  # (take_frame checked)
            self._peer_gone(self._connections.arrived(peer, self._peer_frame.get(zmq.SRCFD)))
        self._acks_due.add(key)
        self._active[key] = now
        dedupe.touch(run, now)
        return state

    def _refuse_runs(self, peer: bytes, runs: list[str], events: list[dict[str, Any]]) -> None:
        """Too many new runs from one connection: the frame is refused (counted, dead-lettered, not
        acknowledged, so a real client sends it again later, when its budget has grown back)."""
        frame = encoding.encode_frame(events[:16])
        self._reject("run_rate", f"peer started more than {self.config.run_rate:g} new runs a minute; "
                                 f"refused {', '.join(runs[:3])}", frame, peer)

    def _make_room(self) -> None:
        """Before a new run: if ``max_runs`` are tracked, forget the least recently active one."""
        while len(self.dedupe.run_ranks) >= self.config.max_runs:
            run = self.dedupe.least_recent()
            if run is None or not self._forget(run):
                return
            self.counters.runs_evicted += 1

    def _reused_run(self, key: tuple[str, int]) -> None:
        """Another process started publishing under a (run, rank) that already has events: its
        events look like duplicates, so say so loudly instead of dropping them quietly."""
        self.counters.reused_run_ids += 1
        log.error("run %s rank %d was started again by another process (a new hello at seq 0): its events "
                  "repeat seqs already journaled and are dropped as duplicates; give every job its own run id",
                  key[0], key[1])

    def _forget_idle(self, before: float) -> None:
        """Drop per-run state of runs silent since ``before``; the journal can rebuild it."""
        for run in self.dedupe.idle_runs(before):
            if self._forget(run):
                log.info("run %s idle for %.0f s: forgot its dedupe state", run, self.config.forget_after)

    def _forget(self, run: str) -> bool:
        """Drop ``run``'s state; False (kept) while events it vouches for cannot be journaled."""
        if self.cluster is not None:
            self._publish(self.cluster.close(run, time.monotonic()))  # an ended run's ranks left behind
        ranks = self.dedupe.run_ranks.get(run, ())
        if run in self._derived_runs or any((run, rank) in self._acks_due for rank in ranks):
            self.commit()  # journal its last events before the state that deduplicated (or numbered) them goes
            if self._lines:
                return False
        for rank in self.dedupe.forget(run):
            key = (run, rank)
            self._hellos.pop(key, None)
            self._active.pop(key, None)
            self.counters.forget_client_drops(key)
        self.journal.release(run)
        self._world.pop(run, None)
        if self.cluster is not None:
            self.cluster.forget(run)
        return True

    def _client_drops(self, key: tuple[str, int], state: RankState, event: dict[str, Any], peer: bytes) -> None:
        """A client's own loss report. Its ``dropped_upto`` moves the rank's floor past the gap, but
        only for seqs below this very event (a client drops only what it numbered before) and as a
        claim of this connection alone (see relay/journal/dedupe.py)."""
        data = event["data"]
        dropped = data.get("dropped")
        if type(dropped) is int and dropped > self.counters.client_dropped.get(key, 0):
            log.warning("run %s rank %d reports %d events dropped in the client", key[0], key[1], dropped)
            self.counters.client_dropped[key] = dropped
        skip, upto = claimed_drop(event), data.get("dropped_upto")
        if skip is not None:
            state.skip_to(skip, peer)
        elif upto is not None and upto != -1:
            self.counters.bad_drop_reports += 1

    def _reject(self, reason: str, detail: str, frame: bytes, peer: bytes) -> None:
        self.counters.rejected[reason] += 1
        total = sum(self.counters.rejected.values())
        if total <= 10 or total % 1000 == 0:
            log.warning("rejected frame from peer %s (%d rejected so far): %s: %s", peer.hex(), total, reason, detail)
        if not self.deadletters.add(reason, detail, frame, peer):
            self.counters.deadletter_overflow += 1

    def _guard_memory(self) -> bool:
        """ZeroMQ assembles a whole message before the relay sees any of it, and bounds each part
        (MAXMSGSIZE) but not how many parts there are: a peer sending one message of endless parts
        makes it allocate without limit. Past ``max_memory`` MiB, every connection is dropped (the
        socket is closed and bound again), which frees what ZeroMQ held; clients reconnect and resend
        what was not acknowledged, so nothing is lost. True if that happened."""
        limit = self.config.max_memory
        if not limit:
            return False
        rss = self._memory.rss_mib()
        if rss <= limit:
            return False
        self.counters.memory_resets += 1
        log.error("relay memory at %d MiB exceeds --max-memory %d MiB (a peer sending an endless multipart "
                  "message?): dropping every connection; clients reconnect and resend (%d times so far)",
                  rss, limit, self.counters.memory_resets)
        assert self._sock is not None and self._monitor is not None
        self._sock.disable_monitor()
        self._monitor.close(0)
        self._sock.close(linger=0)
        self.dedupe.release_all()  # routing ids belong to the closed connections
        self._connections.clear()
        self._acks_due.clear()
        deadline = time.monotonic() + REBIND_TIMEOUT
        while True:  # ZeroMQ lets go of the address in its own thread, a moment after the close
            try:
                self._sock = self._listen(self.address)
                self._monitor = peers.watch(self._sock)
                break
            except AddressInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        trim_heap()
        return True

    def commit(self) -> None:
        """Journal the batch, acknowledge, then fan out; on a journal failure keep everything.
        (Before bind() there is no one to acknowledge: the fuzz tests drive ingest that way.)"""
        lines = self._lines
        if lines:
            now = time.monotonic()
            if now < self._journal_retry_at:
                return
            try:
                self.journal.write_lines(lines)
                self.journal.flush()
            except Exception as exc:  # counted and retried with backoff; no acks until it works
                left = sum(chunk.count(b"\n") for _, chunk in lines)  # one newline per event
                self.counters.written += self._pending - left  # files that did take their part
                self._pending = left
                self._pending_bytes = sum(len(chunk) for _, chunk in lines)
                self.counters.journal_errors += 1
                self._journal_backoff = min(max(self._journal_backoff * 2, 0.1), 5.0)
                self._journal_retry_at = now + self._journal_backoff
                log.error("journal write failed (%d errors, %d events waiting), retrying in %.1f s: %s: %s",
                          self.counters.journal_errors, self._pending, self._journal_backoff, type(exc).__name__, exc)
                return
            self._journal_backoff = 0.0
            self._journal_ok_at = now
            self.counters.written += self._pending
            if self.workers:
                joined = b"".join([chunk for _, chunk in lines])
                for worker in self.workers:
                    worker.submit(joined, self._pending)
            self._lines, self._pending, self._pending_bytes = [], 0, 0
            self._derived_runs.clear()
        self._send_acks()

    def _send_acks(self) -> None:
        if not self._acks_due:
            return
        per_peer: dict[bytes, list[tuple[str, int, int]]] = {}
        ranks = self.dedupe.ranks
        for key in self._acks_due:
            state = ranks[key]
            peer = state.owner
            if peer is not None:  # gone: its next connection is acknowledged when it sends
                per_peer.setdefault(peer, []).append((key[0], key[1], state.ack_for(peer)))
        self._acks_due.clear()
        if self._sock is None:
            return
        for peer, acks in per_peer.items():
            try:
                self._sock.send_multipart([peer, encoding.encode_ack(acks)], zmq.NOBLOCK)
                self.counters.acks_sent += 1
            except zmq.ZMQError:
                pass  # peer gone or slow: it resends, and gets a fresh ack then

    # -- shutdown -----------------------------------------------------------------------------------

    def _each_second(self, now: float) -> None:
        """Sample what rates and lags are computed from; redraw the live line."""
        self._rate.sample(now, self.counters.events)
        for worker in self.workers:
            worker.sample(now)
        if self.live is not None:
            self.live.show(format_line(self.snapshot()))

    def snapshot(self, window: float = 1.0, final: bool = False) -> dict[str, Any]:
        """Every counter, plus events/s over about the last ``window`` seconds and the runs' ranks."""
        now = time.monotonic()
        sinks = {JOURNAL: {"written": self.counters.written, "errors": self.counters.journal_errors,
                                     "dropped": 0, "queued": self._pending,
                                     "lag_s": round(now - self._journal_ok_at, 1) if self._pending else 0.0}}
        sinks.update((w.name, w.stats()) for w in self.workers)
        ranks = self.dedupe.ranks
        relay_ranks = sum((run, RELAY_RANK) in ranks for run in self.dedupe.run_ranks)
        snap = self.counters.snapshot(sinks, len(ranks) - relay_ranks)
        snap.update(ts=round(time.time(), 3), address=self.address, pid=os.getpid(), final=final,
                    events_per_s=round(self._rate.per_s(now, self.counters.events, window), 1), rate_window_s=window,
                    runs=len(self.dedupe.run_ranks), active_window_s=self.config.active_window,
                    per_run=run_view(reversed(self.dedupe.last_seen), self.dedupe.run_ranks, self._active,
                                     self._world, now, self.config.active_window))
        return snap

    def _shutdown(self) -> None:
        if self.live is not None:  # the last live line stays on the terminal
            self.live.show(format_line(self.snapshot()))
            self.live.close()
        if self.cluster is not None:
            now = time.monotonic()
            for run in list(self.cluster.runs):
                self._publish(self.cluster.close(run, now))  # an ended run's ranks left behind
        log.info("shutting down: flushing %d events", self._pending)
        deadline = time.monotonic() + self.config.shutdown_timeout
        self._journal_retry_at = 0.0
        self.commit()
        while self._lines and time.monotonic() < deadline:
            time.sleep(min(self._journal_backoff, 0.5))
            self.commit()
        if self._lines:
            log.error("shutting down with %d events the journal could not take; their clients still hold "
                      "them and will resend to the next relay", self._pending)
        self._ingest_idle.set()  # for good: the sinks drain what they have
        for worker in self.workers:
            worker.close(max(0.5, deadline - time.monotonic()))
        try:
            self.journal.close()
        except OSError as exc:
            self.counters.journal_errors += 1
            log.error("journal close failed: %s", exc)
        self.deadletters.close()
        snap = self.snapshot(self.config.stats_interval, final=True)
        log_stats(snap, final=True)
        write_stats(self.stats_path, snap)
        if self._sock is not None:
            if self._monitor is not None:
                self._sock.disable_monitor()
                self._monitor.close(0)
            self._sock.close(linger=1000)
        if self._auth is not None:
            self._auth.stop()
        if self._ctx is not None:
            self._ctx.term()
        if self.config.ready_file is not None:
            self.config.ready_file.unlink(missing_ok=True)

