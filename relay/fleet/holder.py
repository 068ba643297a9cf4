"""A partition while this consuming relay holds its lease: its view caught up from the central
journal, its durable consumer bound, then each batch committed in the order take, fence, write and
flush, settle, ack (docs/deployment.md, "Exactly once without shared storage").

The order is the guarantee: once the central journal has a batch, acknowledging it is safe whatever
the view did, since a view that failed is rebuilt from the central journal first. A fence whose
outcome is unknown (NATS away) leaves the batch for a later delivery.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from relay.fleet.central import CentralJournal, Fenced
from relay.fleet.connection import describe, failures
from relay.fleet.partition import Partition
from relay.journal.journal import JournalError

log = logging.getLogger("relay.fleet")

#: seconds a run stays silent before its dedupe state is dropped (the view keeps it)
FORGET_AFTER = 3600.0
APPLY_BYTES = 16 << 20  # central journal commits applied to the view in one write, at most
REFUSALS = 3  # fences refused in a row before a batch is left for a later delivery
#: bytes a relay's fetches may have on their way at once, each message counted as large as the
#: server allows: half the servers' default ``max_pending`` (64 MiB). A client the server must hold
#: more for is cut off as a slow consumer, and what was on its way comes again only after
#: ``--ack-wait``: a round of a 400,000-event backlog took one ack_wait instead of about a second
#: (bench/bench_consume.py)
FETCH_BYTES = 32 << 20
FOLLOW_UP = 0.2  # seconds a fetch after the first of a batch waits: messages ready come at once


def fetch_size(wanted: int, partitions: int, max_payload: int) -> int:
    """Messages a partition fetches at once: ``wanted`` (``--fetch``), or fewer, so that one fetch
    on each of the ``partitions`` held stays within FETCH_BYTES."""
    return max(1, min(wanted, FETCH_BYTES // (max(1, partitions) * max(1, max_payload))))


class Holder:
    """Partition ``k`` of ``consumer``'s stream (relay/fleet/consumer.py has the leases)."""

    def __init__(self, k: int, consumer: Any, central: CentralJournal) -> None:
        self.k, self.consumer, self.central = k, consumer, central
        self.config = consumer.config
        self.part: Partition | None = None

    def valid(self) -> bool:
        own = self.consumer.own
        return own is not None and own.valid(self.k, time.monotonic())

    async def run(self, quit_: asyncio.Event) -> None:
        """Hold partition ``k`` until ``quit_``, or until the lease can no longer be trusted."""
        cfg, loop = self.config, asyncio.get_running_loop()
        part = Partition(self.k, cfg.path, cfg.sinks, fsync=cfg.fsync, sink_queue=cfg.sink_queue,
                         shutdown_timeout=cfg.shutdown_timeout, holding=self.valid)
        while True:
            try:
                await loop.run_in_executor(None, part.open, self.central.identity)
                break
            except JournalError as exc:  # another relay process on this folder
                log.warning("partition %d: %s; trying again", self.k, exc)
                if await wait(quit_, 1.0):
                    return
        self.part = part
        try:
            if await self.catch_up(part, quit_):
                sub = await self.subscribe(quit_)
                if sub is not None:
                    await self.loop(part, sub, quit_)
                    await quietly(sub.unsubscribe())
        finally:
            self.part = None
            await loop.run_in_executor(None, part.close)
            log.info("partition %d stopped (%s)", self.k, part.counters)

    async def catch_up(self, part: Partition, quit_: asyncio.Event) -> bool:
        """Apply the central journal's commits after the view's position (retrying while NATS or the
        folder fails); False if stopped first."""
        from nats.errors import Error as NatsError
        loop = asyncio.get_running_loop()
        while not quit_.is_set():
            try:
                last = await self.central.last(self.k)
                # the subject was purged, or the view is of an older stream
                if last < part.position:
                    log.warning("partition %d: the central journal ends at %d, before this view's "
                                "position %d: going on from its end", self.k, last, part.position)
                    await loop.run_in_executor(None, part.settle, last)
                commits: list[tuple[int, bytes]] = []
                size = 0
                async for seq, body in self.central.read(self.k, part.position):
                    commits.append((seq, body))
                    size += len(body)
                    if size >= APPLY_BYTES:
                        await loop.run_in_executor(None, part.apply, commits, time.monotonic())
                        commits, size = [], 0
                await loop.run_in_executor(None, part.apply, commits, time.monotonic())
                return True
            except (TimeoutError, NatsError) as exc:
                log.warning("partition %d: cannot read the central journal now (%s); trying again",
                            self.k, describe(exc))
            except (OSError, JournalError) as exc:
                self.consumer.errors += 1
                log.error("partition %d: the view cannot be written (%s); trying again",
                          self.k, exc)
            part.reset()
            if await wait(quit_, 1.0):
                break
        return False

    async def subscribe(self, quit_: asyncio.Event) -> Any:
        from nats.errors import Error as NatsError

        from relay.fleet.reconcile import bind_consumer
        cfg = self.config
        while not quit_.is_set():
            try:
                return await bind_consumer(self.consumer.js, cfg, self.k)
            except (TimeoutError, NatsError) as exc:
                log.debug("partition %d: cannot bind its consumer yet: %s", self.k, describe(exc))
                if await wait(quit_, 1.0):
                    break
        return None

    async def loop(self, part: Partition, sub: Any, quit_: asyncio.Event) -> None:
        """Fetch and commit; the next batch is fetched while one commits (acks are per message, so
        a batch left unacknowledged comes again whatever was fetched after it)."""
        fetching = asyncio.ensure_future(self.fetch(sub, quit_))
        try:
            while not quit_.is_set() and self.valid():
                msgs = await fetching
                fetching = asyncio.ensure_future(self.fetch(sub, quit_))
                if msgs and not await self.commit(part, msgs, quit_):
                    await self.nak(msgs)  # to the next holder now
                    if not self.valid() or quit_.is_set():
                        return
                part.forget_idle(time.monotonic() - FORGET_AFTER)
        finally:  # a batch fetched ahead and never taken goes back now, not after --ack-wait
            try:
                ahead = await fetching
            except asyncio.CancelledError:
                fetching.cancel()
                raise
            await self.nak(ahead)

    async def fetch(self, sub: Any, quit_: asyncio.Event) -> list[Any]:
        """The next batch to commit: up to ``--fetch`` messages (empty after a second without one),
        taken in fetches of ``fetch_size`` so that what is on its way to this relay stays within
        FETCH_BYTES. A fetch that comes back short, or not within FOLLOW_UP, ends the batch: the
        partition has no more ready (what comes later waits in the subscription for the next)."""
        from nats.errors import Error as NatsError
        cfg, own = self.config, self.consumer.own
        held = len(own.consuming()) if own is not None else 1
        size = fetch_size(cfg.fetch, held, self.consumer.nc.max_payload)
        msgs: list[Any] = []
        while len(msgs) < cfg.fetch:
            want = min(size, cfg.fetch - len(msgs))
            try:
                got = await sub.fetch(want, timeout=FOLLOW_UP if msgs else 1.0)
            except TimeoutError:
                break
            except NatsError as exc:
                log.debug("partition %d: fetch: %s", self.k, describe(exc))
                if not msgs:
                    await wait(quit_, 0.5)
                break
            msgs += got
            if len(got) < want:
                break
        return msgs

    async def commit(self, part: Partition, msgs: list[Any], quit_: asyncio.Event) -> bool:
        """Take, fence, write, flush, settle and acknowledge one batch (the module's docstring);
        False when the batch was left unacknowledged."""
        from nats.errors import Error as NatsError
        loop = asyncio.get_running_loop()
        for _ in range(REFUSALS):
            await loop.run_in_executor(None, part.take_messages, msgs, time.monotonic())
            body = part.uncommitted()
            if body:
                # the lease may be gone: the central journal would refuse us anyway
                if not self.valid():
                    part.reset()
                    return False
                try:
                    position = await self.central.append(self.k, body, part.position)
                except Fenced as exc:
                    log.info("%s: applying what came in, then committing again", exc)
                    part.reset()
                    if not await self.catch_up(part, quit_):
                        return False
                    continue
                except (TimeoutError, NatsError) as exc:  # stored or not: the central journal says
                    log.warning("partition %d: the central journal did not answer (%s): the batch "
                                "comes again", self.k, describe(exc))
                    part.reset()
                    await self.catch_up(part, quit_)
                    return False
                try:
                    await loop.run_in_executor(None, part.write)
                    await loop.run_in_executor(None, part.settle, position)
                except (OSError, JournalError) as exc:
                    # committed: the view is rebuilt from the central journal
                    self.consumer.errors += 1
                    log.error("partition %d: the view cannot be written (%s); rebuilding it",
                              self.k, exc)
                    part.reset()
                    if not await self.catch_up(part, quit_):
                        return False
            await self.ack(msgs)
            return True
        part.reset()
        return False

    async def ack(self, msgs: list[Any]) -> None:
        for msg in msgs:
            await quietly(msg.ack())

    async def nak(self, msgs: list[Any]) -> None:
        await asyncio.gather(*(quietly(msg.nak()) for msg in msgs))


async def wait(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event``; whether it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


async def quietly(coro: Any) -> None:
    """An ack or unsubscribe that may fail while NATS is away: the message comes again,
    deduplicated."""
    try:
        await coro
    except failures() as exc:
        log.debug("NATS: %s", describe(exc))

