"""The forward sink's I/O side: one thread of the sink's own ``Hub`` that reads the node's journal
into the send window, sends it over one ``Link``, takes the central's acks and saves what was
acknowledged (docs/deployment.md, "One relay per node").

The journal, not the batches the sink is handed, is what is forwarded (``notify`` only says which
runs have news), so nothing is dropped on the way: a full window stops reading, and the reader keeps
its place.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import msgspec
import zmq

from relay.client.link_member import LinkMember
from relay.client.send_window import MAX_BATCH_BYTES, MAX_BATCH_EVENTS
from relay.forward.lines import LineReader
from relay.forward.window import ForwardWindow, Key, Stream
from relay.ship.positions import PositionFile
from relay.ship.sources import JournalSources, Source
from relay.wire import schema
from relay.wire.encoding import array_header
from sinks.events import RELAY_RANK

log = logging.getLogger("relay.forward.sink")

STATE_SUFFIX = "_forward.json"
READ_BUDGET = 20_000  # events read from the journal per tick, so acks are read between
# look at the journal for news even without a batch saying so (one may have been dropped)
RESCAN_S = 2.0
SAVE_EVERY = 1.0  # seconds between writes of the state file, when it changed
WARN_AFTER = 5.0  # seconds without any ack while events wait, before saying so (once per outage)
CHUNK = 4096  # lines read and held together
MAX_BYTES = 64 << 20  # of rows held, whatever --forward-window says
#: What encoding a journal row (JSON's types) can raise: an int over 64 bits, a lone surrogate.
UNPACKABLE = (OverflowError, ValueError, TypeError, msgspec.EncodeError)

Positions = tuple[dict[Key, int], dict[str, int]]  # (floors, done): relay/ship/positions.py

#: The sink's own counters (in the relay's stats under sinks.forward.sink).
COUNTERS = ("forwarded", "acked", "resent", "held", "unconfirmed", "skipped_relay_rank",
            "skipped_acked", "not_sent", "bad_lines", "bad_acks", "errors", "refused")


class Forwarder(LinkMember):
    """The I/O side, a member of the sink's own ``relay.wire.io_thread.Hub``: every method but
    notify() and the flags runs on the hub's thread, which alone touches the window, the reader and
    the socket."""

    def __init__(self, journal: Path, to: str, *, server_key: str | None, client_cert: str | None,
                 max_events: int) -> None:
        super().__init__(to, server_key, client_cert, 0.01)
        self.to = to
        #: read by the sink's process, any thread
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.journal = JournalSources(journal)
        self.directory = self.journal.directory
        self.state = PositionFile(journal, STATE_SUFFIX, {"to": to})
        self.state_path = self.state.path
        self.window = ForwardWindow(max_events=max_events, max_bytes=MAX_BYTES)
        nothing: Positions = ({}, {})
        self.floors, done = self.state.load(_positions) or nothing
        self.read_size = done  # run -> its file's size when it was last read to the end
        self.dirty: set[Source] = set()  # sources (relay/ship/sources.py) with lines left to read
        self.ready, self.finished = threading.Event(), threading.Event()
        self.error: str | None = None
        self.idle = False
        self._lock = threading.Lock()
        self._notified: set[str] = set()
        #: rows as encoding.encode_row makes them, in C
        self._pack = msgspec.msgpack.Encoder().encode
        self.lines = LineReader(self._bad_line)
        self._next_rescan = self._next_save = 0.0
        self._waiting_since: float | None = None
        self._warned_at: float | None = None

    def stop(self) -> None:
        """Any thread: leave the hub (then wake it); ``finished`` is set once the state is saved."""
        self._stop.set()

    def notify(self, runs: set[str]) -> None:
        """Any thread: these runs have new lines in the journal."""
        with self._lock:
            self._notified |= runs
            self.idle = False

    @property
    def unacked(self) -> int:
        """Events sent and not acknowledged yet (or waiting to be sent again)."""
        return self.window.events

    # The hooks of relay.client.link_member.LinkMember.

    def _link_up(self, now: float) -> None:
        self.window.connected(now)
        self.ready.set()

    def _link_failed(self, exc: zmq.ZMQError | ValueError) -> None:
        self.error = str(exc)
        self.ready.set()
        self.finished.set()

    def _link_lost(self) -> None:
        self.window.rewind("connection to the central relay lost")

    def _acks(self, acks: list[tuple[str, int, int]], now: float) -> None:
        for run, rank, upto in acks:
            self.window.ack((run, rank), upto, now)

    def _bad_ack(self, exc: schema.FrameError) -> None:
        self.counters["bad_acks"] += 1
        log.warning("ignoring malformed message from the central relay %s: %s", self.to, exc)

    def _refused(self, refused: list[tuple[str, int, str]]) -> None:
        """The central refuses a stream this node forwards: another node's process writes it there
        (relay/journal/writers.py). Said once per stream; its events stay in this journal and are no
        longer sent (counted ``refused``), so the other streams go on (a restarted sink tries
        again)."""
        for run, rank, why in refused:
            key = (run, rank)
            if key not in self.refused_streams:
                self.refused_streams[key] = why
                log.error("the central relay %s refuses run %s rank %d: %s; its events stay in "
                          "this journal and are not forwarded", self.to, run, rank, why)
            self.counters["refused"] += self.window.drop(key)

    def _tick(self, now: float) -> None:
        """Every tick: read, send, release, watch, save. An error (the journal unreadable for now,
        say) is counted and logged, and the next tick tries again: the hub's thread must not end."""
        try:
            self._work(now)
        except Exception as exc:  # noqa: BLE001 - counted and logged; retried at the next tick
            self.counters["errors"] += 1
            if self.counters["errors"] <= 3 or self.counters["errors"] % 1000 == 0:
                log.exception("forwarding to %s failed (%d errors so far); trying again: %s: %s",
                              self.to, self.counters["errors"], type(exc).__name__, exc)

    def _work(self, now: float) -> None:
        window = self.window
        if window.room():
            self._read(now)
        window.pump(now, self._send)
        for (run, rank), gap, n in window.release_stalled(now):
            log.warning("run %s rank %d: the central relay acknowledges only up to seq %d (a gap "
                        "this node's journal has too: the rank dropped events, or one could not be "
                        "sent); %d events after it were sent but cannot be confirmed: counted as "
                        "unconfirmed (they stay in this journal)", run, rank, gap, n)
        self._watch(now)
        if now >= self._next_save:
            self._save()
            self._next_save = now + SAVE_EVERY
        self._count()
        with self._lock:
            self.idle = not self._notified and not self.dirty and not window.events

    def _left(self) -> None:
        self._save()
        self._count()
        self.finished.set()

    def _read(self, now: float) -> None:
        with self._lock:
            fresh, self._notified = self._notified, set()
        if fresh:
            self.dirty |= self.journal.of(fresh)
        if now >= self._next_rescan:
            self._rescan()
            self._next_rescan = now + RESCAN_S
        budget = [READ_BUDGET]
        for source in list(self.dirty):
            size = self.journal.size(source)
            if size is None:
                self.dirty.discard(source)
                continue
            if not self._take(source, budget):
                return
            self.dirty.discard(source)
            if source is not None:  # (what it held before this read: all of it is read now)
                self.read_size[source] = size

    def _rescan(self) -> None:
        """Runs whose file changed since it was last read to its end (at start: every run not known
        to be done); in the file layout, the file."""
        for source, _ in self.journal.sources():
            size = self.journal.size(source)
            if source is None or size not in (None, self.read_size.get(source)):
                self.dirty.add(source)

    def _take(self, run: Source, budget: list[int]) -> bool:
        """Hold ``run``'s new lines (None: the file's) until the window is full or the budget spent
        (False: stopped early, the reader keeps its place), True once they are all read. Lines are
        read a block at a time and held in chunks (see _hold)."""
        window = self.window
        while window.room() and budget[0] > 0:
            limit = min(budget[0], window.max_events - window.events, CHUNK)
            chunk = self.journal.next_lines(run, limit)
            if chunk:
                self._hold(chunk, run)
                budget[0] -= len(chunk)
            if len(chunk) < limit:
                return True
        return False

    def _hold(self, lines: list[bytes], run: str | None) -> None:
        """Hold the events of ``lines`` (of ``run``, if given) in the window (relay/forward/lines.py
        says which lines are events, and what each is on the wire): a rank's consecutive seqs a
        frame's worth at a time, packed in one call, any other event one by one."""
        window, counters, floors = self.window, self.counters, self.floors
        streams, forwarded = window.streams, 0
        for envelope, prefix, rows in self.lines.events(lines, run):
            key: Key = envelope[1:3]  # (run, rank)
            if key[1] == RELAY_RANK:  # the central derives its own from all ranks
                counters["skipped_relay_rank"] += len(rows)
                continue
            if key in self.refused_streams:  # the central refuses it (_refused)
                counters["refused"] += len(rows)
                continue
            stream = streams.get(key) or window.stream(key, floors.pop(key, 0))
            first = rows[0][0]
            in_order = [row[0] for row in rows] == list(range(first, first + len(rows)))
            if first < stream.acked or not in_order:
                forwarded += self._hold_each(key, stream, prefix, rows)
                continue
            for start in range(0, len(rows), MAX_BATCH_EVENTS):
                part = rows[start:start + MAX_BATCH_EVENTS]
                try:
                    packed = self._pack(part)[len(array_header(len(part))):]
                except UNPACKABLE:  # one by one below, which names the event
                    packed = b""
                if packed and len(packed) <= MAX_BATCH_BYTES:
                    window.hold_segment(key, stream, first + start, len(part), prefix, packed)
                    forwarded += len(part)
                else:  # rows too big to share a frame, or one that cannot be packed
                    forwarded += self._hold_each(key, stream, prefix, part)
        counters["forwarded"] += forwarded

    def _hold_each(self, key: Key, stream: Stream, prefix: bytes, rows: list[tuple]) -> int:
        """Hold events of ``key`` one by one; how many were held."""
        counters, held = self.counters, 0
        for row in rows:
            seq = row[0]
            if seq < stream.acked:
                counters["skipped_acked"] += 1
                continue
            try:
                packed = self._pack(row)
            except UNPACKABLE as exc:  # counted and logged; the central's ack shows the gap
                self._not_sent(key, seq, f"cannot encode it: {type(exc).__name__}: {exc}")
                continue
            if len(prefix) + len(packed) + 8 > schema.MAX_FRAME_BYTES:
                self._not_sent(key, seq, f"{len(packed)} bytes exceed a frame")
                continue
            self.window.hold(key, stream, seq, prefix, packed)
            held += 1
        return held

    def _bad_line(self, line: bytes, why: str) -> None:
        self.counters["bad_lines"] += 1
        if self.counters["bad_lines"] <= 10 or self.counters["bad_lines"] % 1000 == 0:
            log.error("a line of %s is not an event and is not forwarded (%d so far; it stays in "
                      "this journal): %s: %.200r", self.journal.path, self.counters["bad_lines"],
                      why, line)

    def _not_sent(self, key: Key, seq: int, why: str) -> None:
        self.counters["not_sent"] += 1
        if self.counters["not_sent"] <= 10 or self.counters["not_sent"] % 1000 == 0:
            log.error("run %s rank %d seq %d is not forwarded (%d so far; it stays in this "
                      "journal): %s", key[0], key[1], seq, self.counters["not_sent"], why)

    def _send(self, prefix: bytes, rows: list[bytes], count: int) -> bool:
        """A compact batch frame of ``count`` events: their rows, back to back in ``rows``."""
        assert self._link is not None
        return self._link.send(b"".join([prefix, array_header(count), *rows]))

    def _watch(self, now: float) -> None:
        """Say once per outage that the central answers nothing while events wait, and when it does
        again."""
        window = self.window
        if not window.events:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = now
        if self._warned_at is not None:
            if window.last_ack > self._warned_at:
                log.info("the central relay %s acknowledges again, after %.0f s", self.to,
                         window.last_ack - self._warned_at + WARN_AFTER)
                self._warned_at = None
        elif (self._waiting_since is not None
              and now - max(window.last_ack, self._waiting_since) > WARN_AFTER):
            self._warned_at = now
            log.warning("the central relay %s has acknowledged nothing for %.0f s (%d events "
                        "waiting): it is not running or not reachable, or it refuses this node "
                        "(CURVE: --curve-server-key must be its public key, and this node's "
                        "--curve-client-cert must be in its --curve-clients); the journal keeps "
                        "everything, retrying", self.to, WARN_AFTER, window.events)

    def _count(self) -> None:
        window, counters = self.window, self.counters
        counters["acked"], counters["resent"] = window.acked, window.resent
        counters["held"], counters["unconfirmed"] = window.events, window.unconfirmed

    def _save(self) -> None:
        floors = {**self.floors, **self.window.floors()}
        busy = {key[0] for key in self.window.active} | self.dirty
        done = ({run: size for run, size in self.read_size.items() if run not in busy}
                if self.directory else {})
        acked: dict[str, dict[str, int]] = {}
        for (run, rank), upto in floors.items():
            if upto:
                acked.setdefault(run, {})[str(rank)] = upto
        self.state.save({"acked": acked, "done": done})


def _positions(state: dict[str, Any]) -> Positions:
    """(floors, done) of the state file: what the central acknowledged per (run, rank), and each
    run's file size when it was read to its end with everything acknowledged."""
    floors = {(run, int(rank)): int(upto) for run, ranks in state["acked"].items()
              for rank, upto in ranks.items()}
    return floors, {str(run): int(size) for run, size in state["done"].items()}
