"""The publisher client every rank uses: non-blocking publish, bounded buffer, acks and resend.

publish() only builds a dict and appends it to a deque, so the training loop pays about a
microsecond and never blocks or raises. A background thread owns the ZeroMQ DEALER socket: it
assigns per-(run, rank) sequence numbers, encodes and sends small batches, keeps every event
until the relay acknowledges it (cumulatively), resends after a reconnect or when acks stall,
and drops the oldest events, counted, when the bounds are reached. Drop counts travel to the
relay as ``stats`` events so the loss is visible in every sink. Given a spool directory, a
Publisher that closes with events the relay never acknowledged writes them there in the journal's
own format, for ``relay replay`` to deliver later.

That thread and its ZeroMQ context are shared by every Publisher of the process (``_Hub``): a
rank has one, but a process simulating hundreds of ranks (or publishing several runs) then pays
for one thread waking every ``send_interval``, not hundreds.
"""
from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import select
import shlex
import socket
import sys
import threading
import time
from typing import Any, Iterator, Mapping

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from relay import curve, schema

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "tcp://127.0.0.1:5557"
ADDRESS_ENV = "RELAY_ADDRESS"

MAX_BATCH_EVENTS = 512
MAX_BATCH_BYTES = 256 << 10
#: What the replay command of the close warning names when the relay's journal is not known here.
UNKNOWN_JOURNAL = "YOUR_JOURNAL"


def resolve_address(address: str | None = None) -> str:
    """Argument first, then $RELAY_ADDRESS (torchrun workers inherit it), then the default."""
    return address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS


class _Hub:
    """The process's one publisher I/O thread and ZeroMQ context, started with the first
    Publisher and ended with the last, so a process hosting many Publishers stays cheap."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._adds: list[Publisher] = []
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = self._pipe()

    @staticmethod
    def _pipe() -> tuple[int, int]:
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        return r, w

    def register(self, pub: "Publisher") -> None:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's thread does not exist here
                self._pid, self._adds, self._thread = os.getpid(), [], None
                self._wake_r, self._wake_w = self._pipe()
            self._adds.append(pub)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="relay-publisher", daemon=True)
                self._thread.start()
        self.wake()

    def wake(self) -> None:
        """Have the thread look at new, stopping or flushing Publishers now, not at its next tick."""
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # a wake-up is already pending

    def _serve(self) -> None:
        ctx = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, 1 << 16)  # three sockets per Publisher
        poller = zmq.Poller()
        members: list[Publisher] = []
        owner: dict[zmq.Socket, Publisher] = {}
        next_tick = interval = 0.0
        woken = True
        try:
            while True:
                with self._lock:
                    adds, self._adds = self._adds, []
                    if not adds and not members:
                        self._thread = None
                        return
                for pub in adds:
                    if pub._open(ctx):
                        members.append(pub)
                        for s in (pub._sock, pub._monitor):
                            owner[s] = pub
                            poller.register(s, zmq.POLLIN)
                if adds:
                    interval = min(p._interval for p in members) if members else 0.0
                # Sleep on the wake-up pipe only, then look at every socket once: polling them all
                # whenever an ack arrives would cost O(Publishers) per ack.
                wait = max(0.0, next_tick - time.monotonic())
                if select.select([self._wake_r], [], [], wait)[0]:
                    self._drain()
                    woken = True
                for s, _ in poller.poll(0):
                    owner[s]._readable(s)
                stopping = [p for p in members if p._stop.is_set()] if woken else []  # close() wakes us
                woken = False
                for pub in stopping:
                    for s in (pub._sock, pub._monitor):
                        poller.unregister(s)
                        del owner[s]
                    members.remove(pub)
                    pub._shut()
                now = time.monotonic()
                if now >= next_tick:
                    for pub in members:
                        pub._tick(now)
                    next_tick = now + interval
        finally:
            for pub in members:
                pub._shut()
            ctx.term()

    def _drain(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass


_HUB = _Hub()


class Publisher:
    """One rank's connection to the relay.

    Memory is bounded twice over: at most ``max_events`` events wait to be encoded, and at most
    ``max_events`` events / ``max_bytes`` bytes wait for an acknowledgement.
    """

    def __init__(
        self,
        run: str,
        rank: int = 0,
        *,
        local_rank: int | None = None,
        world_size: int = 1,
        host: str | None = None,
        address: str | None = None,
        max_events: int = 50_000,
        max_bytes: int = 64 << 20,
        send_interval: float = 0.01,
        resend_after: float = 2.0,
        curve_server_key: str | None = None,
        curve_client_cert: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        spool_journal: str | os.PathLike[str] | None = None,
    ) -> None:
        """``spool_dir``: where close() writes what the relay never acknowledged (None: nowhere, it is
        only counted); ``spool_journal``: the relay's journal, named in the replay command it logs."""
        if not schema.valid_run_id(run):
            raise ValueError(f"run id {run!r} must match {schema.RUN_ID_RE.pattern}")
        for name, val in (("rank", rank), ("world_size", world_size), ("max_events", max_events)):
            if not isinstance(val, int) or val < 0:
                raise ValueError(f"{name} must be a non-negative int, got {val!r}")
        self.run = run
        self.rank = rank
        self.address = resolve_address(address)
        # Frames are compact batches: this envelope once, then one row per event (docs/protocol.md).
        # The spool adds it to every row again, as the relay does.
        self.envelope: dict[str, Any] = {
            "v": schema.SCHEMA_VERSION, "run": run, "rank": rank,
            "local_rank": rank if local_rank is None else local_rank,
            "world_size": max(world_size, 1), "host": (host or socket.gethostname())[: schema.MAX_NAME_LEN],
        }
        self._prefix = schema.compact_prefix(self.envelope)
        self.spool_path = (None if spool_dir is None
                           else os.path.join(os.fspath(spool_dir), f"{run}.rank{rank}.spool.jsonl"))
        self._spool_journal = None if spool_journal is None else os.fspath(spool_journal)
        self._spooled = 0  # written to the spool at close: not acknowledged, not lost either
        self._dropped_spool = 0  # meant for the spool, which could not be written
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._interval = send_interval
        self._resend_after = resend_after
        self._curve_server_key = curve_server_key or os.environ.get(curve.SERVER_KEY_ENV)
        self._curve_client_cert = curve_client_cert or os.environ.get(curve.CLIENT_CERT_ENV)

        # (ts, type, step, epoch, stage, data) per event: the cheapest thing publish() can append.
        self._pending: collections.deque[tuple] = collections.deque()
        self._closed = False
        self._flush_requested = False
        self._published = 0
        self._dropped_full = 0  # by publish(): pending queue full
        self._dropped_closed = 0  # by publish(): after close()
        self._dropped_error = 0  # by publish(): could not even build the event
        # Owned by the background thread:
        self._unacked: collections.deque[tuple[int, bytes]] = collections.deque()
        self._pack_row = schema.row_packer().pack
        self._unacked_bytes = 0
        self._next_seq = 0
        self._next_send = 0  # first seq in _unacked not yet handed to the socket
        self._acked = 0
        self._resent = 0
        self._dropped_unacked = 0
        self._dropped_upto = -1
        self._dropped_bad = 0  # unencodable or oversized events
        self._reported_drops = 0
        self._last_report = 0.0
        self._protocol_errors = 0

        # Owned by the hub thread once registered:
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._backoff = resend_after
        self._last_progress = time.monotonic()

        self._stop = threading.Event()
        self._ready = threading.Event()
        self._done = threading.Event()
        self.publish("hello", {
            "pid": os.getpid(), "address": self.address, "python": sys.version.split()[0],
            "pyzmq": zmq.__version__, "max_events": max_events,
        })
        _HUB.register(self)
        self._ready.wait(5.0)
        atexit.register(self._close_at_exit)

    def _close_at_exit(self) -> None:
        """A script that never called close() still gets a bounded last flush and a loss warning."""
        self.close(timeout=float(os.environ.get("RELAY_EXIT_FLUSH_TIMEOUT", "5")))

    # -- caller side ---------------------------------------------------------------------------

    def publish(self, type: str, data: Mapping[str, Any], *, step: int | None = None,
                epoch: float | None = None, stage: str | None = None) -> None:
        """Queue one event; never blocks, never raises (problems are counted as drops).

        ``data`` is encoded later, on the I/O thread: hand over a dict you will not change.
        """
        try:
            if self._closed:
                self._dropped_closed += 1
                return
            pending = self._pending
            if len(pending) >= self._max_events:
                pending.popleft()
                self._dropped_full += 1
            pending.append((time.time(), type, step, epoch, stage, data))
            self._published += 1
        except Exception:  # noqa: BLE001 - never raise into training; counted below
            self._dropped_error += 1

    def flush(self, timeout: float = 5.0) -> int:
        """Wait until every event is acknowledged or ``timeout`` passes; return how many are not."""
        deadline = time.monotonic() + max(timeout, 0.0)
        self._flush_requested = True
        while True:
            left = self.unacknowledged
            if left == 0 or time.monotonic() >= deadline or self._done.is_set():
                return left
            time.sleep(min(self._interval, 0.005))

    def close(self, timeout: float = 5.0) -> int:
        """Flush, stop the background thread and release the socket; returns how many events the
        relay never acknowledged (written to the spool, when there is one, and logged in one line)."""
        if self._stop.is_set():
            return self.unacknowledged
        atexit.unregister(self._close_at_exit)
        self.publish("stats", self._drop_report(), stage="client")  # the final word on losses
        self.flush(timeout)
        self._closed = True
        self._stop.set()
        _HUB.wake()
        self._done.wait(max(timeout, 1.0))
        left = self.unacknowledged
        if not left:
            return 0
        if self.spool_path is None:
            log.warning("relay %s: %d events of run %s rank %d were never acknowledged",
                        self.address, left, self.run, self.rank)
        elif not self._done.is_set():
            log.error("relay %s: %d events of run %s rank %d were never acknowledged and are not spooled: the "
                      "publisher thread did not stop", self.address, left, self.run, self.rank)
        else:
            self._spool()
        return left

    def _spool(self) -> None:
        """close(), once the I/O thread has let go of this Publisher: append what the relay never
        acknowledged to the spool as the relay would have journaled it, so that ``relay replay``
        (which skips what the journal already holds) delivers exactly the missing events."""
        from sinks.jsonl import encode_line  # only a Publisher that has to spool pays for this import

        events = [event for event in map(self._spool_event, self._spool_rows()) if event is not None]
        self._pending.clear()
        self._unacked.clear()
        self._unacked_bytes = 0
        path = self.spool_path
        assert path is not None, "close() spools only with a spool_dir"
        if not events:
            return
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                view = memoryview(b"".join([encode_line(event) for event in events]))
                try:
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except OSError:
                    os.ftruncate(fd, start)  # no half line for replay to trip over
                    raise
            finally:
                os.close(fd)
        except OSError as exc:
            self._dropped_spool += len(events)
            log.error("relay %s: %d events of run %s rank %d were never acknowledged and are lost: cannot write "
                      "the spool %s: %s", self.address, len(events), self.run, self.rank, path, exc)
            return
        self._spooled += len(events)
        if self._spool_journal is None:
            where, journal = f"the journal of the relay at {self.address}", UNKNOWN_JOURNAL
        else:
            where, journal = "the journal", shlex.quote(self._spool_journal)
        log.warning("relay %s: %d events of run %s rank %d were never acknowledged; spooled, deliver them to %s "
                    "with: relay replay %s --sink jsonl --path %s", self.address, len(events), self.run, self.rank,
                    where, shlex.quote(path), journal)

    def _spool_rows(self) -> Iterator[bytes]:
        """Every unacknowledged event as its encoded row: those already numbered, then the ones
        still queued, numbered on from where the I/O thread stopped (as _take_pending would)."""
        for _, blob in self._unacked:
            yield blob
        limit = schema.MAX_FRAME_BYTES - len(self._prefix) - 8
        for ts, kind, step, epoch, stage, data in self._pending:
            try:
                blob = self._pack_row((self._next_seq, ts, kind, step, epoch, stage, data))
            except Exception as exc:  # noqa: BLE001 - an unencodable event is counted, not raised
                self._drop_bad(f"cannot encode {kind} event: {exc}")
                continue
            if len(blob) > limit:
                self._drop_bad(f"{kind} event of {len(blob)} bytes exceeds {limit}")
                continue
            self._next_seq += 1
            yield blob

    def _spool_event(self, blob: bytes) -> dict[str, Any] | None:
        """One row as the relay would journal it: decoded as the relay decodes, the envelope added,
        and checked by the relay's rules (it would reject an invalid event: so does the spool)."""
        try:
            row = msgpack.unpackb(blob, raw=False, strict_map_key=True, use_list=True)
            event = {**self.envelope, **dict(zip(schema.ROW_FIELDS, row))}
            schema.validate_event(event)
        except ValueError as exc:  # FrameError, a non-string map key: what the relay rejects too
            self._drop_bad(f"event not spooled, the relay would reject it: {exc}")
            return None
        return event

    @property
    def unacknowledged(self) -> int:
        """Events published but not yet acknowledged by the relay (queued, in flight or unsent)."""
        return len(self._pending) + len(self._unacked)

    @property
    def dropped(self) -> int:
        """Events this client gave up on, for any reason."""
        return (self._dropped_full + self._dropped_closed + self._dropped_error
                + self._dropped_unacked + self._dropped_bad + self._dropped_spool)

    @property
    def stats(self) -> dict[str, int]:
        """Counters for logs and tests."""
        return {
            "published": self._published, "acked": self._acked, "unacked": self.unacknowledged,
            "resent": self._resent, "dropped": self.dropped, "dropped_full": self._dropped_full,
            "dropped_unacked": self._dropped_unacked, "dropped_bad": self._dropped_bad,
            "dropped_closed": self._dropped_closed, "dropped_error": self._dropped_error,
            "dropped_spool": self._dropped_spool, "spooled": self._spooled, "protocol_errors": self._protocol_errors,
        }

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- background thread ---------------------------------------------------------------------

    def _open(self, ctx: zmq.Context) -> bool:
        """Hub thread: create and connect the socket; False (and closed) if that is impossible."""
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.setsockopt(zmq.RCVHWM, 1000)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        # Sends fail (and events stay in our bounded buffer) while no relay is connected, so after
        # a reconnect everything unacknowledged goes out again from the oldest, in order.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            if self._curve_server_key:
                curve.secure_client(sock, self._curve_server_key, self._curve_client_cert)
            sock.connect(self.address)
        except (zmq.ZMQError, ValueError) as exc:
            log.error("cannot connect to relay %s: %s; events will be counted as dropped", self.address, exc)
            self._closed = True
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)
            self._ready.set()
            self._done.set()
            return False
        self._sock, self._monitor = sock, monitor
        self._last_progress = time.monotonic()
        self._ready.set()
        return True

    def _readable(self, which: zmq.Socket) -> None:
        """Hub thread: the socket has acks, or the monitor saw the connection change."""
        if which is self._sock:
            if self._read_acks(which):
                self._last_progress = time.monotonic()
                self._backoff = self._resend_after
        elif self._read_monitor(which):
            self._rewind("connection lost")

    def _tick(self, now: float) -> None:
        """Hub thread, every ``send_interval``: encode what was published, resend if stalled, send."""
        unacked = self._unacked
        if not (self._pending or unacked or self._flush_requested or self.dropped != self._reported_drops):
            return  # an idle rank costs the shared thread next to nothing
        self._take_pending()
        self._report_drops()
        if self._flush_requested:  # someone is waiting: retry soon, not after a long backoff
            self._flush_requested = False
            self._backoff = min(self._backoff, self._resend_after)
        in_flight = bool(unacked) and self._next_send > unacked[0][0]
        if in_flight and now - self._last_progress > self._backoff:
            self._rewind("no acknowledgement for %.1f s" % self._backoff)
            self._last_progress = now
            self._backoff = min(self._backoff * 2, 30.0)
            in_flight = False
        assert self._sock is not None
        self._send(self._sock)
        if not in_flight and unacked and self._next_send > unacked[0][0]:
            self._last_progress = now  # the ack timeout runs from the send, not from an idle spell

    def _shut(self) -> None:
        """Hub thread: read the last acks, release the sockets, let close() return."""
        if self._sock is not None:
            self._readable(self._sock)
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._sock.close(0)
            self._sock = self._monitor = None
        self._done.set()

    def _read_acks(self, sock: zmq.Socket) -> bool:
        progressed = False
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return progressed
            try:
                acks = schema.decode_ack(frame)
            except schema.FrameError as exc:
                self._protocol_errors += 1
                log.warning("ignoring malformed message from relay %s: %s", self.address, exc)
                continue
            for run, rank, upto in acks:
                if run != self.run or rank != self.rank:
                    continue
                if upto > self._next_seq:  # an ack for seqs this client never numbered: not our relay's word
                    self._protocol_errors += 1
                    upto = self._next_seq
                unacked = self._unacked
                while unacked and unacked[0][0] < upto:
                    self._unacked_bytes -= len(unacked.popleft()[1])
                    self._acked += 1
                    progressed = True
                if self._next_send < upto:
                    self._next_send = upto

    @staticmethod
    def _read_monitor(monitor: zmq.Socket) -> bool:
        """True if the connection to the relay went down since the last look: what was in flight on
        it may be lost. (Not when it comes up: with ZMQ_IMMEDIATE nothing was sent while it was down,
        and what went out since it came up is on the new connection; resending that too only made
        the relay count the first frame of every publisher as duplicates.)"""
        lost = False
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return lost
            lost = lost or event["event"] == zmq.EVENT_DISCONNECTED

    def _rewind(self, why: str) -> None:
        if self._unacked and self._next_send > self._unacked[0][0]:
            self._resent += self._next_send - self._unacked[0][0]
            log.debug("resending %d unacknowledged events (%s)", self._next_send - self._unacked[0][0], why)
        if self._unacked:
            self._next_send = self._unacked[0][0]

    def _take_pending(self) -> None:
        pending = self._pending
        unacked = self._unacked
        limit = schema.MAX_FRAME_BYTES - len(self._prefix) - 8
        while pending:
            ts, kind, step, epoch, stage, data = pending.popleft()
            try:
                blob = self._pack_row((self._next_seq, ts, kind, step, epoch, stage, data))
            except Exception as exc:  # noqa: BLE001 - an unencodable event is counted, not raised
                self._drop_bad(f"cannot encode {kind} event: {exc}")
                continue
            if len(blob) > limit:
                self._drop_bad(f"{kind} event of {len(blob)} bytes exceeds {limit}")
                continue
            unacked.append((self._next_seq, blob))
            self._unacked_bytes += len(blob)
            self._next_seq += 1
            if kind == "stats":
                continue  # a loss report never causes a loss it does not report
            while len(unacked) > self._max_events or self._unacked_bytes > self._max_bytes:
                seq, old = unacked.popleft()
                self._unacked_bytes -= len(old)
                self._dropped_unacked += 1
                self._dropped_upto = seq
                if self._next_send <= seq:
                    self._next_send = seq + 1

    def _drop_bad(self, why: str) -> None:
        self._dropped_bad += 1
        if self._dropped_bad == 1 or self._dropped_bad % 1000 == 0:
            log.warning("dropped event (%d so far): %s", self._dropped_bad, why)

    def _report_drops(self) -> None:
        """Queue a cumulative ``stats`` event whenever the drop count moved."""
        dropped = self.dropped
        now = time.monotonic()
        if dropped == self._reported_drops or now - self._last_report < 1.0:
            return
        self._reported_drops = dropped
        self._last_report = now
        self._pending.append((time.time(), "stats", None, None, "client", self._drop_report()))
        self._take_pending()

    def _drop_report(self) -> dict[str, int]:
        return {
            "dropped": self.dropped, "dropped_full": self._dropped_full,
            "dropped_unacked": self._dropped_unacked, "dropped_bad": self._dropped_bad,
            "dropped_closed": self._dropped_closed, "dropped_error": self._dropped_error,
            "dropped_upto": self._dropped_upto, "published": self._published, "resent": self._resent,
        }

    def _send(self, sock: zmq.Socket) -> None:
        unacked = self._unacked
        if not unacked or self._next_send > unacked[-1][0]:
            return
        blobs: list[bytes] = []
        size = 0
        for seq, blob in itertools.islice(unacked, self._next_send - unacked[0][0], None):
            if blobs and (len(blobs) >= MAX_BATCH_EVENTS or size + len(blob) > MAX_BATCH_BYTES):
                if not self._send_batch(sock, blobs, seq):
                    return
                blobs, size = [], 0
            blobs.append(blob)
            size += len(blob)
        self._send_batch(sock, blobs, unacked[-1][0] + 1)

    def _send_batch(self, sock: zmq.Socket, blobs: list[bytes], next_send: int) -> bool:
        try:
            sock.send(schema.compact_frame(self._prefix, blobs), zmq.NOBLOCK)
        except zmq.Again:
            return False  # not connected yet or HWM reached: keep them, retry next round
        self._next_send = next_send
        return True
