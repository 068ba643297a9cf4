"""``relay consume``: one asyncio loop, one NATS connection (docs/deployment.md, "Consuming
relays").

At start the options are reconciled with what exists (relay/fleet/reconcile.py) and the central
journal made sure of; then every ``tick`` the leases are read (relay/fleet/leases.py), the ownership
rules decide (relay/fleet/ownership.py), and a task per held partition runs
(relay/fleet/holder.py). The stats file's ``holders`` lets a viewer name who holds a view this
relay no longer does (relay/journal/fleet_views.py).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.fleet.central import CentralJournal
from relay.fleet.connection import NatsSettings, connect, describe
from relay.fleet.holder import Holder, quietly, wait
from relay.fleet.identity import Claimant
from relay.fleet.leases import claim_name, read_leases
from relay.fleet.ownership import Claim, Ownership, Renew, Start, Stop
from relay.fleet.reconcile import check_stream, lease_bucket, update_consumers
from relay.sinkhost.spec import SinkSpec
from sinks.files import write_atomic

log = logging.getLogger("relay.fleet")

_PARTITIONS = re.compile(r"partition\((\d+)")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass
class ConsumeConfig:
    settings: NatsSettings
    path: Path
    sinks: list[SinkSpec] = field(default_factory=list)
    stream: str = "RELAY"
    prefix: str = "relay.events"
    name: str = ""  # this relay's member id (default: host-pid)
    durable: str = "relay"  # consumer of partition k: <durable>-p<k>
    bucket: str = ""  # the leases' KV bucket (default: <stream>-leases)
    ttl: float = 10.0
    renew: float = 2.0
    tick: float = 0.5
    fetch: int = 64
    max_ack_pending: int = 512
    ack_wait: float = 10.0
    fsync: bool = False
    sink_queue: int = 200_000
    shutdown_timeout: float = 10.0
    stats_interval: float = 1.0

    def __post_init__(self) -> None:
        self.name = _UNSAFE.sub("_", self.name or f"{os.uname().nodename}-{os.getpid()}")
        self.bucket = self.bucket or f"{self.stream}-leases"


def partitions_of(stream_config: Any) -> int | None:
    """P, from the stream's partition transform (None: the stream has none, so it is one
    partition)."""
    transform = getattr(stream_config, "subject_transform", None)
    found = _PARTITIONS.search(getattr(transform, "dest", "") or "")
    return int(found.group(1)) if found else None


class Consumer:
    """The consuming relay's loop; ``stop()`` (a signal handler may call it) ends it cleanly."""

    def __init__(self, config: ConsumeConfig) -> None:
        self.config = config
        self.stats_path = config.path / f"_relay_consume_{config.name}.json"
        self._stop = asyncio.Event()
        self._tasks: dict[int, asyncio.Task] = {}
        self._quit: dict[int, asyncio.Event] = {}
        self._holders: dict[int, Holder] = {}
        self.own: Ownership | None = None
        self.errors = 0
        self._closing = False
        # the last stats written (the Prometheus endpoint reads it)
        self.latest: dict[str, Any] | None = None
        self._claimant: Claimant | None = None  # who this relay is: its member key's value

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        cfg = self.config
        connecting = asyncio.ensure_future(connect(cfg.settings, disconnected_cb=self._disconnected,
                                                   reconnected_cb=self._reconnected))
        stopping = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait([connecting, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        # stopped while NATS was away: nothing was taken, nothing to give back
        if not connecting.done():
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
            return
        self.nc = connecting.result()
        self.js = self.nc.jetstream()
        try:
            info = await self._wait_for_stream()
            ready = info is not None and await self._set_up(info)
        except BaseException:  # reconcile.Mismatch: the command line says it in one line
            self._closing = True
            await quietly(self.nc.close())
            raise
        if not ready:
            self._closing = True
            await quietly(self.nc.close())
            return
        partitions = partitions_of(info.config) or 1
        self.own = Ownership(cfg.name, partitions, ttl=cfg.ttl, renew=cfg.renew, margin=cfg.ttl / 4)
        log.info("consuming stream %s (%d partitions) as %s; journals under %s", cfg.stream,
                 partitions, cfg.name, cfg.path)
        next_stats = 0.0
        while not self.own.done():
            if self._stop.is_set():
                self.own.leave()
            await self._tick()
            now = time.monotonic()
            if now >= next_stats:
                self._write_stats()
                next_stats = now + cfg.stats_interval
            if self._stop.is_set():
                await asyncio.sleep(cfg.tick)
            else:
                await wait(self._stop, cfg.tick)
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._write_stats(final=True)
        self._closing = True
        await quietly(self.nc.flush(2))  # the last acks
        await quietly(self.nc.close())

    async def _wait_for_stream(self) -> Any:
        """The stream's info, once the stream exists (a node relay creates it); None if stopped
        first."""
        from nats.errors import Error as NatsError
        from nats.js.errors import NotFoundError
        warned = False
        while not self._stop.is_set():
            try:
                return await self.js.stream_info(self.config.stream)
            except NotFoundError:
                if not warned:
                    log.warning("stream %s does not exist yet; waiting for a node relay to "
                                "create it", self.config.stream)
                    warned = True
            except (TimeoutError, NatsError) as exc:
                log.debug("stream %s: %s", self.config.stream, describe(exc))
            await wait(self._stop, 1.0)
        return None

    async def _set_up(self, info: Any) -> bool:
        """The options against what exists (reconcile.Mismatch: one line, exit 2), the central
        journal, the lease bucket (retried while JetStream does not answer); False if stopped
        first."""
        from nats.errors import Error as NatsError
        cfg = self.config
        check_stream(info, cfg)
        replicas = info.config.num_replicas or 1
        self.central = CentralJournal(self.nc, self.js, cfg.stream, cfg.prefix, self.nc.max_payload,
                                      cfg.name)
        while not self._stop.is_set():
            try:
                await self.central.ensure(replicas)
                self.kv = await lease_bucket(self.js, cfg, replicas)
                self._claimant = Claimant.here(cfg.path, os.getpid())
                await claim_name(self.kv, cfg, self._claimant)
                await update_consumers(self.js, cfg, partitions_of(info.config) or 1)
                return True
            except (TimeoutError, NatsError) as exc:
                log.warning("cannot set up the stream's central journal and leases now (%s); "
                            "trying again", describe(exc))
            await wait(self._stop, 1.0)
        return False

    async def _tick(self) -> None:
        own = self.own
        assert own is not None
        members, leases = await read_leases(self.kv, self.js, self.config, own, self._claimant)
        actions = own.plan(time.monotonic(), leases, members)
        await asyncio.gather(*(self._act(action) for action in actions))

    async def _act(self, action: Any) -> None:
        from nats.errors import Error as NatsError
        from nats.js.errors import KeyWrongLastSequenceError
        own, cfg = self.own, self.config
        assert own is not None
        key = f"p{action.partition}"
        sent = time.monotonic()
        try:
            if isinstance(action, Claim):
                revision = await asyncio.wait_for(self.kv.create(key, cfg.name.encode()), cfg.renew)
                own.claimed(action.partition, revision, sent)
                log.info("took partition %d", action.partition)
            elif isinstance(action, Renew):
                try:
                    revision = await asyncio.wait_for(
                        self.kv.update(key, cfg.name.encode(), last=action.revision), cfg.renew)
                    own.renewed(action.partition, revision, sent)
                except KeyWrongLastSequenceError:
                    log.warning("partition %d: our lease was taken over; stopping",
                                action.partition)
                    for stop in own.lost(action.partition):
                        self._halt(stop)
            elif isinstance(action, Start):
                self._start(action.partition)
            elif isinstance(action, Stop):
                self._halt(action)
        except KeyWrongLastSequenceError:
            pass  # another relay claimed it first
        except (TimeoutError, NatsError) as exc:
            if isinstance(action, Renew):
                own.unanswered(action.partition)
            log.debug("lease %s for partition %d: %s", type(action).__name__, action.partition,
                      describe(exc))

    def _start(self, k: int) -> None:
        previous = self._tasks.get(k)
        quit_ = self._quit[k] = asyncio.Event()
        task = self._tasks[k] = asyncio.create_task(self._consume(k, quit_, previous),
                                                    name=f"partition-{k}")
        task.add_done_callback(lambda done: self._ended(k, quit_, done))

    def _ended(self, k: int, quit_: asyncio.Event, task: asyncio.Task) -> None:
        """A partition's task is over: say why if it failed, and if nobody stopped it, let the next
        plan start it again (while the lease is ours)."""
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            self.errors += 1
            log.error("partition %d failed, starting it again: %s", k, describe(failure),
                      exc_info=failure)
        if not quit_.is_set() and self.own is not None:
            self.own.ended(k)

    def _halt(self, action: Stop) -> None:
        quit_ = self._quit.get(action.partition)
        if quit_ is not None:
            quit_.set()
        if action.release:
            asyncio.create_task(self._release(action.partition, self._tasks.get(action.partition)))

    async def _release(self, k: int, task: asyncio.Task | None) -> None:
        """Delete our lease once partition ``k`` stopped, so another relay takes it at once."""
        from nats.errors import Error as NatsError
        own = self.own
        assert own is not None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        revision = own.held[k].revision if k in own.held else None
        if own.stopped(k) and revision is not None:
            try:
                await asyncio.wait_for(self.kv.delete(f"p{k}", last=revision), self.config.renew)
                log.info("gave partition %d back", k)
            except (TimeoutError, NatsError) as exc:
                log.info("gave partition %d back (its lease expires: %s)", k, describe(exc))

    async def _consume(self, k: int, quit_: asyncio.Event, previous: asyncio.Task | None) -> None:
        """Hold partition ``k`` until ``quit_`` (relay/fleet/holder.py)."""
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)  # its view is closed first
        holder = self._holders[k] = Holder(k, self, self.central)
        try:
            await holder.run(quit_)
        finally:
            if self._holders.get(k) is holder:
                del self._holders[k]

    async def _disconnected(self) -> None:
        if not self._closing:
            log.warning("lost the connection to NATS; reconnecting (partitions stop once their "
                        "leases run out)")

    async def _reconnected(self) -> None:
        url = self.nc.connected_url
        log.info("reconnected to NATS at %s", url.netloc if url else "?")

    def _write_stats(self, final: bool = False) -> None:
        """``final``: the relay is stopping (viewers of its folder say it is not running)."""
        own = self.own
        now = time.monotonic()
        parts = {k: holder.part for k, holder in self._holders.items() if holder.part is not None}
        for part in parts.values():
            part.sample(now)  # the sinks' lag
        snap = self.latest = {"name": self.config.name, "pid": os.getpid(),
                              "ts": round(time.time(), 3), "errors": self.errors,
                "held": sorted(own.consuming()) if own else [],
                "partitions_total": own.partitions if own else None,
                "holders": own.holders() if own else {},
                "partitions": {k: part.stats() for k, part in parts.items()},
                **({"final": True} if final else {})}
        try:
            self.config.path.mkdir(parents=True, exist_ok=True)
            write_atomic(self.stats_path, json.dumps(snap))
        except OSError as exc:
            log.warning("cannot write %s: %s", self.stats_path, exc)
