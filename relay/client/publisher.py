"""The publisher client every rank uses: non-blocking publish, bounded buffer, acks and resend
(docs/architecture.md, "The data path": ranks never wait).

publish() only appends a tuple to a deque, so the training loop pays about a microsecond and never
blocks or raises; the process's one I/O thread (relay/wire/io_thread.py) encodes and numbers the
events, and each Publisher's SendWindow (relay/client/send_window.py) keeps them until the relay
acknowledges them. Given a spool directory, close() writes what the relay never acknowledged there
(relay/client/spool.py).
"""
from __future__ import annotations

import atexit
import collections
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import zmq

from relay.client import identity, spool
from relay.client.fork import ForkHandover, ForkPipe, live
from relay.client.link_member import LinkMember
from relay.client.send_window import SendWindow
from relay.wire import curve, encoding, schema
from relay.wire.address import resolve_address
from relay.wire.io_thread import read_monitor, shared_hub
from sinks.events import session_base

__all__ = ["Publisher", "UNKNOWN_JOURNAL"]
UNKNOWN_JOURNAL = spool.UNKNOWN_JOURNAL  # the journal the close warning names, when none is known

log = logging.getLogger(__name__)

#: Stands in the queue for the closing ``stats`` event's counters until the I/O thread numbers it:
#: counted then, they take in every drop of the events numbered before it (and its children's
#: last events go before it: _FORKED_TAKEN says that was done).
_CLOSING_REPORT: dict[str, int] = {}
_FORKED_TAKEN: dict[str, int] = {}


class Publisher(ForkHandover, LinkMember):
    """One rank's connection to the relay. Memory is bounded twice over: at most ``max_events``
    events wait to be encoded, and at most ``max_events`` / ``max_bytes`` bytes wait for an ack."""

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
        attempt: int = 0,
        restart: int | None = None,
    ) -> None:
        """``spool_dir``: where close() writes what the relay never acknowledged (None: nowhere, it
        is only counted); ``spool_journal``: the relay's journal, named in the replay command it
        logs; ``attempt``: which attempt of ``run`` this process belongs to (a job resumed from a
        checkpoint continues its run as attempt 1, 2 ...): its seqs start at
        ``attempt_base(attempt)``, above every earlier attempt's, so the relay takes none of its
        events for a duplicate; ``restart``: how often torchrun restarted this rank (None:
        ``TORCHELASTIC_RESTART_COUNT``): it numbers from ``session_base(attempt, restart)``, above
        the attempt's earlier starts, so a restarted rank continues its stream once the one before
        has gone (docs/protocol.md)."""
        identity.check(run, rank, world_size, max_events, attempt)
        restart = identity.restart_count(restart)
        self.attempt = attempt
        self.restart = restart
        self.run = run
        self.rank = rank
        self.address = resolve_address(address)
        self.envelope = identity.envelope(run, rank, local_rank, world_size, host)
        self._prefix = encoding.compact_prefix(self.envelope)
        self.spool_path = identity.spool_path(spool_dir, run, rank)
        self._spool_journal = None if spool_journal is None else os.fspath(spool_journal)
        self._spooled = 0  # written to the spool at close: not acknowledged, not lost either
        self._dropped_spool = 0  # meant for the spool, which could not be written
        self._max_events = max_events
        super().__init__(self.address, curve_server_key or os.environ.get(curve.SERVER_KEY_ENV),
                         curve_client_cert or os.environ.get(curve.CLIENT_CERT_ENV), send_interval)

        # (ts, type, step, epoch, stage, data) per event: the cheapest thing publish() can append.
        self._pending: collections.deque[tuple] = collections.deque()
        self._closed = False
        self._flush_requested = False
        self._published = 0  # publish() calls
        self._reports = 0  # its own stats events numbered so far (the I/O thread's)
        self._dropped_full = 0  # by publish(): pending queue full
        self._dropped_closed = 0  # by publish(): after close()
        self._dropped_error = 0  # by publish(): could not even build the event
        # Owned by the background thread:
        self._window = SendWindow(max_events=max_events, max_bytes=max_bytes,
                                  resend_after=resend_after, now=time.monotonic(),
                                  first_seq=session_base(attempt, restart))
        self._pack_row = encoding.row_packer().pack
        self._dropped_bad = 0  # unencodable or oversized events
        self._reported_drops = 0
        self._last_report = 0.0
        self._malformed_acks = 0

        self._fork: ForkPipe | None = None  # made at the first fork (relay/client/fork.py)
        self._child = False  # a forked child's copy: publish() hands events to the parent
        self._forwarded = 0  # events its forked children handed over (the I/O thread's)
        self._dropped_forked = 0  # ... and those they could not (the I/O thread's)

        self._ready = threading.Event()
        self._done = threading.Event()
        live.add(self)
        self.publish("hello", {
            "pid": os.getpid(), "address": self.address, "python": sys.version.split()[0],
            "pyzmq": zmq.__version__, "max_events": max_events, "attempt": attempt,
            "restart": restart, "session": self.session.hex(),
        })
        self._hub = shared_hub()
        self._hub.register(self)
        self._ready.wait(5.0)
        atexit.register(self._close_at_exit)

    def _close_at_exit(self) -> None:
        """A script that never called close() still gets a bounded last flush and a loss warning."""
        self.close(timeout=float(os.environ.get("RELAY_EXIT_FLUSH_TIMEOUT", "5")))

    def publish(self, type: str, data: Mapping[str, Any], *, step: int | None = None,
                epoch: float | None = None, stage: str | None = None) -> None:
        """Queue one event; never blocks, never raises (problems are counted as drops). ``data`` is
        encoded later, on the I/O thread: hand over a dict you will not change."""
        try:
            if self._child:
                self._to_parent((time.time(), type, step, epoch, stage, data))
                return
            if self._closed:
                self._dropped_closed += 1
                return
            pending = self._pending
            if len(pending) >= self._max_events:
                pending.popleft()
                self._dropped_full += 1
            pending.append((time.time(), type, step, epoch, stage, data))
            self._published += 1
        except Exception:  # noqa: BLE001 - never raise into training: counted, said
            self._dropped_error += 1
            if self._dropped_error == 1 or self._dropped_error % 1000 == 0:
                log.exception("publish() dropped a %s event (%d so far)", type, self._dropped_error)

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
        relay never acknowledged (written to the spool, when there is one, and logged in one line).
        An exception that interrupts the flush (a signal's handler, Ctrl-C) still gets the rest of
        the closing, the spool included, before it goes on."""
        if self._stop.is_set():
            return self.unacknowledged
        atexit.unregister(self._close_at_exit)
        if self._child:  # what it published went to the parent, whose Publisher sends it
            self._closed = True
            return 0
        # the final word on losses (never dropped for a full queue; its counters taken as it is
        # numbered)
        self._pending.append((time.time(), "stats", None, None, "client", _CLOSING_REPORT))
        try:
            self.flush(timeout)
        finally:
            left = self._stop_and_spool(timeout)
        return left

    def _stop_and_spool(self, timeout: float) -> int:
        self._closed = True
        live.discard(self)
        self._stop.set()
        self._hub.wake()
        self._done.wait(max(timeout, 1.0))
        if self._fork is not None and self._done.is_set():
            self._fork.close()  # a child that publishes from now on loses what it publishes
        left = self.unacknowledged
        if not left:
            return 0
        if self.spool_path is None:
            why = self.refused_streams.get((self.run, self.rank))
            why = f": {why}" if why else ""
            log.warning("relay %s: %d events of run %s rank %d were never acknowledged%s",
                        self.address, left, self.run, self.rank, why)
        elif not self._done.is_set():
            log.error("relay %s: %d events of run %s rank %d were never acknowledged and are not "
                      "spooled: the publisher thread did not stop",
                      self.address, left, self.run, self.rank)
        else:
            self._spool()
        return left

    def _spool(self) -> None:
        """close(), once the I/O thread has let go of this Publisher: append what the relay never
        acknowledged to the spool (relay/client/spool.py), and log the command that delivers it."""
        # numbered on from where the I/O thread stopped, none dropped
        self._take_pending(bounded=False)
        events = []
        for blob in self._window.take_all():
            try:
                events.append(spool.row_event(self.envelope, blob))
            # FrameError, a non-string map key: what the relay rejects too
            except ValueError as exc:
                self._drop_bad(f"event not spooled, the relay would reject it: {exc}")
        path = self.spool_path
        assert path is not None, "close() spools only with a spool_dir"
        if not events:
            return
        try:
            spool.append(path, events)
        except OSError as exc:
            self._dropped_spool += len(events)
            log.error("relay %s: %d events of run %s rank %d were never acknowledged and are lost: "
                      "cannot write the spool %s: %s",
                      self.address, len(events), self.run, self.rank, path, exc)
            return
        self._spooled += len(events)
        refused = self.refused_streams.get((self.run, self.rank))
        log.warning("%s", spool.told(self.address, len(events), self.run, self.rank, path,
                                     self._spool_journal, refused))

    @property
    def unacknowledged(self) -> int:
        """Events published but not yet acknowledged by the relay (queued, in flight or unsent)."""
        return len(self._pending) + len(self._window.unacked)

    @property
    def published(self) -> int:
        """Events this client made: its publish() calls, its own stats events and its forked
        children's."""
        return self._published + self._reports + self._forwarded + self._dropped_forked

    @property
    def dropped(self) -> int:
        """Events this client gave up on, for any reason."""
        return (self._dropped_full + self._dropped_closed + self._dropped_error
                + self._window.dropped_unacked + self._dropped_bad + self._dropped_spool
                + self._dropped_forked)

    @property
    def stats(self) -> dict[str, int]:
        """Counters for logs and tests."""
        w = self._window
        return {
            "published": self.published, "acked": w.acked, "unacked": self.unacknowledged,
            "forwarded": self._forwarded, "dropped_forked": self._dropped_forked,
            "resent": w.resent, "dropped": self.dropped, "dropped_full": self._dropped_full,
            "dropped_unacked": w.dropped_unacked, "dropped_bad": self._dropped_bad,
            "dropped_closed": self._dropped_closed, "dropped_error": self._dropped_error,
            "dropped_spool": self._dropped_spool, "spooled": self._spooled,
            "dropped_sent": w.dropped_sent,
            "protocol_errors": self._malformed_acks + w.protocol_errors,
        }

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    _read_monitor = staticmethod(read_monitor)  # where tests find the monitor filter

    def _link_up(self, now: float) -> None:
        self._window.connected(now)
        self._ready.set()

    def _link_failed(self, exc: zmq.ZMQError | ValueError) -> None:
        log.error("cannot connect to relay %s: %s; events will be counted as dropped",
                  self.address, exc)
        self._closed = True
        self._ready.set()
        self._done.set()

    def _link_lost(self) -> None:
        self._window.rewind("connection lost")

    def _acks(self, acks: list[tuple[str, int, int]], now: float) -> None:
        for run, rank, upto in acks:
            if run == self.run and rank == self.rank:
                self._window.ack(upto, now)

    def _bad_ack(self, exc: schema.FrameError) -> None:
        self._malformed_acks += 1
        log.warning("ignoring malformed message from relay %s: %s", self.address, exc)

    def _left(self) -> None:
        """The last acks are read and the sockets released: close() may return."""
        self._done.set()

    def _tick(self, now: float) -> None:
        """Every ``send_interval``: encode what was published, resend if stalled, send."""
        if not (self._pending or self._window.unacked or self._flush_requested
                or self.dropped != self._reported_drops or self._fork is not None):
            return  # an idle rank costs the shared thread next to nothing
        # before a closing report close() queued
        self._pending.extendleft(reversed(self._take_forked()))
        self._take_pending()
        self._report_drops()
        if self._flush_requested:
            self._flush_requested = False
            self._window.hurry()
        self._window.pump(now, self._send_batch)

    def _take_pending(self, bounded: bool = True) -> None:
        """Encode and number what publish() queued; past the bounds the oldest are dropped, unless
        not ``bounded`` (close() spools everything) or the event is a loss report."""
        pending, window = self._pending, self._window
        limit = schema.MAX_FRAME_BYTES - len(self._prefix) - 8
        while pending:
            ts, kind, step, epoch, stage, data = pending.popleft()
            if data is _CLOSING_REPORT:  # its forked children's last events first
                pending.appendleft((ts, kind, step, epoch, stage, _FORKED_TAKEN))
                pending.extendleft(reversed(self._take_forked()))
                continue
            if data is _FORKED_TAKEN:
                data = self._drop_report()
                self._reports += 1
            try:
                blob = self._pack_row((window.next_seq, ts, kind, step, epoch, stage, data))
            except Exception as exc:  # noqa: BLE001 - an unencodable event is counted, not raised
                self._drop_bad(f"cannot encode {kind} event: {exc}")
                continue
            if len(blob) > limit or (len(blob) > spool.LINE_SAFE_BYTES
                                     and spool.line_too_long(self.envelope, blob)):
                self._drop_bad(f"{kind} event of {len(blob)} bytes exceeds {limit}, "
                               "or its journal line the bound")
                continue
            window.push(blob, droppable=bounded and kind != "stats")

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
        self._reports += 1
        self._take_pending()

    def _drop_report(self) -> dict[str, int]:
        """The counters a ``stats`` event carries. ``published`` is every event this client made
        before it, its own earlier ``stats`` events included, so the rank's lines before its last
        ``stats`` line number exactly ``published - dropped`` (docs/jsonl.md); ``dropped_sent`` are
        those of ``dropped_unacked`` given up after they were sent (a relay that took them but could
        not journal them yet may still write them)."""
        w = self._window
        return {
            "dropped": self.dropped, "dropped_full": self._dropped_full,
            "dropped_unacked": w.dropped_unacked, "dropped_bad": self._dropped_bad,
            "dropped_closed": self._dropped_closed, "dropped_error": self._dropped_error,
            "dropped_upto": w.dropped_upto, "published": self.published,
            "resent": w.resent, "dropped_sent": w.dropped_sent,
            "dropped_forked": self._dropped_forked,
        }

    def _send_batch(self, blobs: list[bytes]) -> bool:
        assert self._link is not None
        return self._link.send(encoding.compact_frame(self._prefix, blobs))
