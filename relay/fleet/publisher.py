"""The nats sink's work, on an asyncio loop of its own thread: connect (waiting however long NATS is
away), make sure of the stream, publish each source's chunks until acknowledged
(docs/sinks/nats.md, "What it does").

A source's position moves past a chunk only once it and every chunk before it are acknowledged,
and is saved only then; on one connection a run's chunks are stored in journal order, so only a
chunk published again can land after its successors (dedupe takes seqs in any order).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.fleet import connection, resume, stream
from relay.fleet.chunks import Chunk, ChunkReader, key_source, position_file, positions, source_key
from relay.fleet.connection import NatsSettings
from relay.fleet.identity import Claimant, NodeClaim
from relay.fleet.loop_thread import LoopThread

log = logging.getLogger("relay.fleet.nats_sink")

ACK_TIMEOUT = 5.0  # seconds to wait for a PubAck before publishing the chunk again
RESCAN_S = 2.0  # look at the journal for news even without a batch saying so
SAVE_EVERY = 0.5  # seconds between writes of the state file, when it changed
HEADER_ROOM = 1024  # bytes of a message's max_payload left for its headers
RETRY_S = (0.1, 0.25, 0.5, 1.0, 2.0)  # waits between attempts at a chunk, the last repeated
COUNTERS = ("connected", "chunks", "published", "bytes", "duplicates", "retries", "held", "skipped",
            "too_big", "errors")


@dataclass
class StreamSpec:
    name: str
    prefix: str
    partitions: int
    replicas: int
    duplicate_window: float
    max_age: float


class NatsPublisher:
    """Publishes a journal's chunks to a JetStream stream. ``start()``/``notify()``/``stop()`` from
    any thread; the rest runs on the loop's thread."""

    def __init__(self, journal: Path, settings: NatsSettings, spec: StreamSpec, node: str,
                 claimant: Claimant, id_file: Path | None, *, max_lines: int, max_bytes: int,
                 linger: float, inflight: int) -> None:
        self.settings, self.spec, self.node = settings, spec, node
        self.claim = NodeClaim(node, spec.name, spec.replicas, claimant, id_file, self._count_error)
        self.host = claimant.host
        self.max_lines, self.max_bytes, self.linger = max_lines, max_bytes, linger
        self.chunks = ChunkReader(journal)
        self.state = position_file(journal, {"stream": spec.name, "prefix": spec.prefix,
                                             "node": node})
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.acked = self.state.load(positions) or {}  # source key -> (file, offset, floor) acked
        self.idle = False
        self.loop = LoopThread("nats-sink")
        self.inflight = inflight
        self._slots: Any = None  # an asyncio.Semaphore of the loop's, made there
        self._dirty: set[str | None] = set()
        self._busy: set[str | None] = set()
        self._resumed: set[str | None] = set()
        #: chunks the stream holds past a gap, per source
        self._ahead: dict[str | None, list[resume.Stored]] = {}
        #: the highest stream sequence seen: a chunk published after it is stored above it
        self._high_seq = 0
        self._wake: asyncio.Event | None = None
        self._connected: asyncio.Event | None = None
        self._nc: Any = None
        self._js: Any = None
        self._stream_ok = False
        self._main: Any = None
        self._holding: Any = None  # the node claim's task
        self._down_since: float | None = None

    # Called from any thread.

    @property
    def state_path(self) -> Path:
        """Where the positions JetStream acknowledged are kept."""
        return self.state.path

    def start(self) -> None:
        for key, (_, offset, _) in self.acked.items():
            self.chunks.seek(key_source(key), offset)
        self._main = self.loop.submit(self._run())

    def notify(self, runs: set[str]) -> None:
        """These runs have new lines in the journal."""
        self.idle = False
        self.loop.call_soon(self._notified, runs)

    def stop(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for all that was read to be acknowledged, then stop, save."""
        deadline = time.monotonic() + wait
        while not self.idle and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._main is not None:
            self._main.cancel()
        try:
            self.loop.run(self._close(), 5.0)
        finally:
            self.loop.stop()

    # Run on the loop thread.

    def _notified(self, runs: set[str]) -> None:
        self._dirty |= self.chunks.of(runs)
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        self._wake, self._connected = asyncio.Event(), asyncio.Event()
        self._slots = asyncio.Semaphore(self.inflight)
        connecting = asyncio.ensure_future(self._connect())
        next_rescan = next_save = 0.0
        try:
            while True:
                now = time.monotonic()
                if now >= next_rescan:
                    self._dirty |= {source for source, _ in self.chunks.sources()
                                    if self.chunks.behind(source)}
                    next_rescan = now + RESCAN_S
                while self._stream_ok and self._dirty - self._busy:
                    source = next(iter(self._dirty - self._busy))
                    self._dirty.discard(source)
                    self._busy.add(source)
                    asyncio.ensure_future(self._drain(source))
                if now >= next_save:
                    self.state.save({"sources": self.acked})
                    next_save = now + SAVE_EVERY
                self.idle = self._stream_ok and not self._dirty and not self._busy
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), SAVE_EVERY)
        finally:
            connecting.cancel()

    async def _connect(self) -> None:
        """Connect (retrying for ever), then make sure of the stream (retrying while JetStream
        cannot say)."""
        self._nc = await connection.connect(self.settings, on_error=self._error,
                                            disconnected_cb=self._disconnected,
                                            reconnected_cb=self._reconnected)
        self._js = self._nc.jetstream(timeout=ACK_TIMEOUT)
        room = self._nc.max_payload - HEADER_ROOM
        if self.max_bytes > room:
            log.info("chunks of at most %d bytes: the server's max_payload is %d", room,
                     self._nc.max_payload)
            self.max_bytes = room
        assert self._connected is not None  # (made by _run, which every caller runs under)
        self._connected.set()
        self._up()
        for wait in connection.backoff(1.0, 30.0):
            failed = await self._ensure_stream()
            self._stream_ok = failed is None
            if self._stream_ok:
                break
            self.counters["errors"] += 1
            log.warning("%s; trying again in %.0f s (the journal keeps everything)", failed, wait)
            await asyncio.sleep(wait)
        self._holding = asyncio.ensure_future(self.claim.hold(self._js))
        self.counters["connected"] = int(self._nc.is_connected)
        assert self._wake is not None  # (made by _run, which every caller runs under)
        self._wake.set()

    async def _ensure_stream(self) -> str | None:
        """Make sure of the stream; what went wrong (None: it is there)."""
        spec = self.spec
        config = stream.stream_config(spec.name, spec.prefix, spec.partitions, spec.replicas,
                                      spec.duplicate_window, spec.max_age)
        try:
            info, created = await stream.ensure_stream(self._js, config)
        except connection.failures() as exc:  # API, timeout and connection errors: logged, retried
            info = getattr(self._nc, "_server_info", None)
            return stream.not_ready(spec.name, spec.replicas, exc, info)
        # a new replicated stream takes a moment to elect its leader: publishing waits for it
        if created:
            for _ in range(100):
                if info.cluster is None or info.cluster.leader:
                    break
                await asyncio.sleep(0.1)
                try:
                    info = await self._js.stream_info(spec.name)
                except connection.failures() as exc:  # timeouts while it is placed: asked again
                    log.debug("stream %s: %s", spec.name, connection.describe(exc))
        subjects = info.config.subjects or []
        if f"{spec.prefix}.>" not in subjects:
            log.warning("stream %s takes %s, not %s.>: messages to %s.NODE.RUN may not be "
                        "stored there", spec.name, subjects, spec.prefix, spec.prefix)
        log.info("%s stream %s on %s (replicas %s)", "created" if created else "using", spec.name,
                 self.settings.display, info.config.num_replicas)
        self.claim.use_replicas(info.config.num_replicas or 1)
        self._high_seq = max(self._high_seq, (info.state.last_seq or 0) if info.state else 0)
        return None

    async def _drain(self, source: str | None) -> None:
        """Publish ``source``'s chunks until it has no new line: several in flight (as slots allow),
        its position moving past each in order as they are acknowledged."""
        # (file, end, publishing, floor)
        pending: deque[tuple[str, int, asyncio.Future, int]] = deque()
        try:
            # this node is ours: the stream's messages of it are this journal's
            await self.claim.wait()
            if source not in self._resumed:
                await self._resume(source)
                self._resumed.add(source)
            ahead = self._ahead.get(source, [])
            while True:
                if not pending or not self._slots.locked():
                    await self._slots.acquire()
                    # the stream holds it: step over
                    if ahead and self.chunks.position(source) >= ahead[0].start:
                        stored = ahead.pop(0)
                        self.chunks.seek(source, max(stored.end, self.chunks.position(source)))
                        done = asyncio.get_running_loop().create_future()
                        done.set_result(None)
                        file = self.acked[source_key(source)][0]
                        pending.append((file, stored.end, done, stored.seq - 1))
                        continue
                    stop = ahead[0].start if ahead else None
                    chunk = self.chunks.take(source, self.max_lines, self.max_bytes, stop=stop)
                    if chunk is not None:
                        if not pending and self.linger and chunk.lines < self.max_lines \
                                and len(chunk.body) < self.max_bytes // 2:
                            # let a chunk fill a little when lines trickle in
                            await asyncio.sleep(self.linger)
                            chunk = self.chunks.take(source, self.max_lines, self.max_bytes,
                                                     more=chunk, stop=stop) or chunk
                        floor = self._high_seq  # published after it was seen: stored above it
                        publishing = asyncio.ensure_future(self._publish(chunk))
                        pending.append((chunk.file, chunk.end, publishing, floor))
                        continue
                    self._slots.release()
                if not pending:
                    break
                await self._settle(source, pending)
        except asyncio.CancelledError:
            raise
        # a journal unreadable for now: counted, logged, read again
        except Exception as exc:  # noqa: BLE001
            self._count_error(f"reading {source or 'the journal'}: {type(exc).__name__}: {exc}")
            self._dirty.add(source)
            while pending:
                await self._settle(source, pending)
            await asyncio.sleep(1.0)
        finally:
            self._busy.discard(source)
            assert self._wake is not None  # (made by _run, which every caller runs under)
            self._wake.set()

    async def _settle(self, source: str | None,
                      pending: deque[tuple[str, int, asyncio.Future, int]]) -> None:
        """Wait for the oldest chunk in flight to be acknowledged; the source's position moves past
        it, its floor to below every chunk of it that may be stored past that position
        (relay/fleet/resume.py)."""
        file, end, publishing, _ = pending[0]
        await publishing
        pending.popleft()
        self._slots.release()
        floors = [floor for *_, floor in pending] \
            + [stored.seq - 1 for stored in self._ahead.get(source, ())]
        # (none in flight: the high seq)
        self.acked[source_key(source)] = (file, end, min([self._high_seq, *floors]))

    async def _resume(self, source: str | None) -> None:
        """Where ``source`` resumes: past its saved position and whatever the stream stored after it
        (relay/fleet/resume.py); a source the state file does not know (the file lost, or older than
        the stream), after the stream's last message of this node and run."""
        key = source_key(source)
        path = self.chunks.file(source)
        known = self.acked.get(key)
        if path is None or (known is not None and (known[2] is None or known[0] != path.name)):
            return  # (a state file from before floors were kept: its position, as it was)
        token = stream.run_token(source) if source is not None else "*"
        subject = f"{self.spec.prefix}.*.{stream.run_token(self.node)}.{token}"
        found = await resume.resume_at(self._js, self.spec.name, subject, path.name, source,
                                       known, self._count_error)
        if found is None:
            return  # nothing of this node and run in the stream yet
        offset, floor, self._ahead[source] = found
        self.chunks.seek(source, offset)
        self.acked[key] = (path.name, offset, floor)

    async def _publish(self, chunk: Chunk) -> None:
        """Publish ``chunk`` until JetStream acknowledges it (a duplicate ack too)."""
        subject = stream.publish_subject(self.spec.prefix, self.node, chunk.run)
        headers = {**chunk.headers(self.node), "Relay-Host": self.host}
        # one line over the server's max_payload
        if len(chunk.body) > self._nc.max_payload - HEADER_ROOM:
            self.counters["too_big"] += 1
            log.error("%s: a line of %d bytes exceeds the NATS server's max_payload (%d): not "
                      "published (it stays in the journal); raise max_payload on the servers",
                      headers["Nats-Msg-Id"], len(chunk.body), self._nc.max_payload)
            return
        self.counters["held"] += chunk.lines
        attempt = 0
        try:
            while True:
                assert self._connected is not None  # (made by _run, which every caller runs under)
                await self._connected.wait()
                await self.claim.wait()
                try:
                    ack = await self._js.publish(subject, chunk.body, timeout=ACK_TIMEOUT,
                                                 stream=self.spec.name, headers=headers)
                except asyncio.CancelledError:
                    raise
                except connection.failures() as exc:  # timeouts, no responders, lost: again
                    self.counters["retries"] += 1
                    if attempt == 0 or attempt % 20 == 0:
                        log.warning("chunk %s not acknowledged yet (%s); publishing it again",
                                    headers["Nats-Msg-Id"], connection.describe(exc))
                    await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                    attempt += 1
                    continue
                break
        finally:
            self.counters["held"] -= chunk.lines
        self._high_seq = max(self._high_seq, ack.seq)
        counters = self.counters
        counters["chunks"] += 1
        counters["published"] += chunk.lines
        counters["bytes"] += len(chunk.body)
        counters["duplicates"] += bool(ack.duplicate)
        counters["skipped"] = self.chunks.skipped

    async def _error(self, exc: Exception) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("NATS %s not reachable (%s): the journal keeps everything; publishing "
                        "when it is back", self.settings.display, connection.describe(exc))
        if connection.refused(exc):
            self._count_error(f"NATS {self.settings.display} refused the connection: "
                              f"{connection.describe(exc)}")

    async def _disconnected(self) -> None:
        self.counters["connected"] = 0
        if self._connected is not None:
            self._connected.clear()
        if self._down_since is None:
            self._down_since = time.monotonic()

    async def _reconnected(self) -> None:
        self.counters["connected"] = int(self._stream_ok)
        assert self._connected is not None  # (made by _run, which every caller runs under)
        self._connected.set()
        self._up()

    def _up(self) -> None:
        if self._down_since is not None:
            log.info("NATS %s reachable again after %.1f s", self.settings.display,
                     time.monotonic() - self._down_since)
            self._down_since = None

    def _count_error(self, what: str) -> None:
        self.counters["errors"] += 1
        if self.counters["errors"] <= 5 or self.counters["errors"] % 100 == 0:
            log.error("nats sink: %s (%d errors so far); retrying", what, self.counters["errors"])

    async def _close(self) -> None:
        self.state.save({"sources": self.acked})
        if self._holding is not None:
            self._holding.cancel()
        if self._nc is not None and not self._nc.is_closed:
            if self._nc.is_connected:
                await self.claim.release(self._js)
            await self._nc.close()
        if not self.idle:
            log.warning("nats sink stopped with journal lines not acknowledged by NATS: they stay "
                        "in the journal and are published when a relay runs on it again")
