"""The fleet tier's consuming side: events/s from a JetStream R3 stream (a 3-node cluster on this
machine) into the journals of one and of two consuming relays (``relay consume``, no other sink),
beside nats-py alone fetching and acknowledging the same messages, and the fair floor (issue 40
item 4 (b)): nats-py fetching them, appending each batch to a file (fsync as ``relay consume``
does: by default not, as run here) and then acknowledging it, in alternating rounds.

Each round fills a fresh stream (8 partitions, its own name and prefix) with 8 runs of journal lines
in chunks of 1,000 (as the nats sink publishes them; 1,600,000 events, ``BENCH_CONSUME_EVENTS``
sets another number), then starts the readers on that backlog; the clock runs from the first
message JetStream delivered to a relay (the raw reader: the first message fetched) until the
partition journals hold every line (until it acknowledged the last message): the rate at which a
consuming tier drains a backlog, which is its ceiling in steady state too. The round's streams are
deleted after it. The servers run with
``sync_interval: always``, as docs/deployment.md recommends: each acknowledgement (the consuming
relays' fenced commits to the central journal too) waits for an fsync. Over the same window each
round also takes the CPU time of the reader (the relays' processes, or the raw reader's) and of the
three servers, per event: on a machine shared with other work these are steadier than the rates, and
they say which side a reader's time goes to.

    python -m bench.bench_consume [--quick]

With ``BENCH_CONSUME_BASELINE=<a checkout of another commit>`` the rounds are the raw reader and one
consuming relay of this tree beside one of that tree's (a before/after in the same run).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.common import ROOT, Section, alternate_many, cli
from relay.fleet.central import journal_stream
from relay.fleet.holder import fetch_size
from relay.fleet.stream import partition_filter, stream_config
from relay.wire.lines import encode_line

PARTITIONS = 8
CHUNK = 1000
READER_CPU, SERVERS_CPU = "reader CPU us/event", "servers CPU us/event"
ONE, TWO, RAW = "JetStream R3 -> 1 consuming relay's journals", "JetStream R3 -> 2 consuming relays' journals", \
    "nats-py alone: fetch + ack the same messages"
FLOOR = "fair floor: nats-py fetch -> append to a file (no fsync, as the relays run) -> ack"
FSYNC = False  # relay consume's default (--no-fsync), which the relays here run with


def _lines(run: str, count: int) -> list[bytes]:
    return [encode_line({"v": 1, "run": run, "rank": seq % 2, "local_rank": 0, "world_size": 2, "host": "node",
                         "seq": seq // 2, "ts": 1.7e9 + seq, "type": "metrics", "step": seq // 2, "epoch": None,
                         "stage": "train", "data": {"loss": 1.0 / (seq + 1), "learning_rate": 1e-4}})
            for seq in range(count)]


async def _create(urls: str, name: str, prefix: str) -> None:
    import nats
    nc = await nats.connect(urls.split(","))
    await nc.jetstream().add_stream(stream_config(name, prefix, PARTITIONS, 3, 600, 0))
    await nc.close()


async def _delete(urls: str, names: list[str]) -> None:
    """Remove a round's streams (its backlog, and the central journal its relays fenced into): a
    larger backlog's rounds would otherwise hold gigabytes of disk until the run ends."""
    import nats
    from nats.js.errors import NotFoundError
    nc = await nats.connect(urls.split(","))
    for name in names:
        with contextlib.suppress(NotFoundError):
            await nc.jetstream().delete_stream(name)
    await nc.close()


async def _fill(urls: str, prefix: str, runs: int, per_run: int) -> None:
    import nats
    nc = await nats.connect(urls.split(","))
    js = nc.jetstream()
    for r in range(runs):
        lines = _lines(f"run-{r}", per_run)
        acks = [js.publish(f"{prefix}.node.run-{r}", b"".join(lines[i:i + CHUNK]), timeout=30)
                for i in range(0, per_run, CHUNK)]
        await asyncio.gather(*acks)
    await nc.close()


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes ``pids`` used so far."""
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def _relays(work: Path, urls: str, servers: Callable[[], float], n: int, total: int, round_id: str,
            root: Path = ROOT) -> dict[str, float]:
    name, prefix = f"C{round_id}", f"bench.c{round_id}"
    asyncio.run(_create(urls, name, prefix))
    asyncio.run(_fill(urls, prefix, 8, total // 8))
    central = work / f"central-{round_id}"
    procs: list[subprocess.Popen] = []

    def start() -> None:
        for i in range(n):
            with open(work / f"consume-{round_id}-{i}.log", "ab") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "relay", "consume", "--nats-url", urls, "--nats-stream", name,
                     "--nats-prefix", prefix, "--path", f"{central}/", "--name", f"r{i}", "--log-level", "warning"],
                    cwd=root, stderr=log, env={**os.environ, "PYTHONPATH": str(root)}))
    try:
        asyncio.run(_first_consumer(urls, name, start, procs))
        begin = time.monotonic()  # the clock starts as the relays start fetching: their start-up is not counted
        pids = [proc.pid for proc in procs]
        cpu, server_cpu = cpu_seconds(pids), servers()
        count = _Lines(central)
        while count() < total:
            time.sleep(0.02)
        seconds = time.monotonic() - begin
        return {"events/s": total / seconds, READER_CPU: (cpu_seconds(pids) - cpu) / total * 1e6,
                SERVERS_CPU: (servers() - server_cpu) / total * 1e6}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
        asyncio.run(_delete(urls, [name, journal_stream(name)]))


async def _first_consumer(urls: str, name: str, start: Callable[[], None], procs: list[subprocess.Popen]) -> None:
    """``start`` the relays, and return once one of them made a partition's consumer (JetStream's
    advisory says so; the relay fetches from it at once): as the raw reader's clock starts with its
    first fetch, both time the whole drain. (Started at the first line journaled, a round of a
    backlog a few batches deep left out what each partition fetched and took before its first
    commit: about a third of 1,600,000 events, nearly all of 400,000.)"""
    import nats
    nc = await nats.connect(urls.split(","))
    try:
        sub = await nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.CREATED.{name}.*")
        start()
        deadline = time.monotonic() + 120
        while True:
            try:
                await sub.next_msg(timeout=0.5)
                return
            except TimeoutError:
                if time.monotonic() > deadline or any(proc.poll() is not None for proc in procs):
                    raise RuntimeError(f"no consuming relay made a consumer of {name} within 120 s") from None
    finally:
        await nc.close()


class _Lines:
    """The lines in the partition journals, each file read on from where the last call left it: the
    clock's polling must not take the CPU the relays are measured on (reading every journal whole
    every 20 ms did)."""

    def __init__(self, central: Path) -> None:
        self.central, self.lines = central, 0
        self.read: dict[Path, int] = {}

    def __call__(self) -> int:
        for path in self.central.glob("p*/*.jsonl"):
            with open(path, "rb") as file:
                file.seek(self.read.get(path, 0))
                chunk = file.read()
            self.read[path] = self.read.get(path, 0) + len(chunk)
            self.lines += chunk.count(b"\n")
        return self.lines


def _raw(urls: str, servers: Callable[[], float], total: int, round_id: str,
         keep: Path | None = None) -> dict[str, float]:
    """nats-py fetching and acknowledging the backlog; with ``keep`` (the fair floor), each batch
    appended to that folder's partition file (fsync'd with FSYNC) before it is acknowledged."""
    name, prefix = f"R{round_id}", f"bench.r{round_id}"
    asyncio.run(_create(urls, name, prefix))
    asyncio.run(_fill(urls, prefix, 8, total // 8))

    async def drain() -> dict[str, float]:
        import nats
        nc = await nats.connect(urls.split(","))
        js = nc.jetstream()
        subs = [await js.pull_subscribe(partition_filter(prefix, k), durable=f"raw-p{k}", stream=name)
                for k in range(PARTITIONS)]
        batch = fetch_size(64, PARTITIONS, nc.max_payload)  # as a relay holding every partition fetches
        state = {"seen": 0, "start": 0.0, "end": 0.0, "cpu": 0.0, "servers": 0.0}

        async def one(k: int, sub: Any) -> None:
            from nats.errors import Error as NatsError
            fd = None if keep is None else os.open(keep / f"p{k}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            while state["seen"] < total:
                try:
                    msgs = await sub.fetch(batch, timeout=0.5)
                except (TimeoutError, NatsError):  # a stream just made, its leader still being elected
                    continue
                if not state["start"]:
                    state.update(start=time.monotonic(), cpu=time.process_time(), servers=servers())
                if fd is not None:
                    os.write(fd, b"".join([msg.data for msg in msgs]))
                    if FSYNC:
                        os.fsync(fd)
                for msg in msgs:
                    state["seen"] += msg.data.count(b"\n")
                    await msg.ack()
                if state["seen"] >= total and not state["end"]:
                    state.update(end=time.monotonic(), cpu=time.process_time() - state["cpu"],
                                 servers=servers() - state["servers"])
            if fd is not None:
                os.close(fd)
        await asyncio.gather(*(one(k, s) for k, s in enumerate(subs)))
        await nc.close()
        await _delete(urls, [name])
        return {"events/s": total / (state["end"] - state["start"]), READER_CPU: state["cpu"] / total * 1e6,
                SERVERS_CPU: state["servers"] / total * 1e6}
    return asyncio.run(drain())


def _folder(work: Path, name: str) -> Path:
    """A fresh folder under ``work`` for one round's files."""
    folder = work / f"{name}-{time.monotonic_ns()}"
    folder.mkdir(parents=True)
    return folder


def run(quick: bool = False) -> Section:
    from tests.nats_helpers import NatsCluster

    total, rounds = (16_000, 1) if quick else (int(os.environ.get("BENCH_CONSUME_EVENTS", 1_600_000)), 3)
    baseline = os.environ.get("BENCH_CONSUME_BASELINE")
    section = Section("consume", "Issue 18: the fleet tier's consuming relays")
    counter = iter(range(1_000_000))
    with tempfile.TemporaryDirectory(prefix="bench-consume-") as tmp, \
            NatsCluster(Path(tmp) / "nats", sync="always") as cluster:
        work = Path(tmp)

        def servers() -> float:
            return cpu_seconds([proc.pid for proc in cluster.procs if proc is not None])
        contenders = {
            RAW: lambda: _raw(cluster.urls, servers, total, f"{next(counter)}"),
            FLOOR: lambda: _raw(cluster.urls, servers, total, f"{next(counter)}", _folder(work, "floor")),
            ONE: lambda: _relays(work, cluster.urls, servers, 1, total, f"{next(counter)}"),
        }
        if baseline:  # the third reader: one relay of that tree's code
            base = Path(baseline).resolve()
            contenders[f"{ONE}, the code of {baseline}"] = \
                lambda: _relays(work, cluster.urls, servers, 1, total, f"{next(counter)}", base)
        else:
            contenders[TWO] = lambda: _relays(work, cluster.urls, servers, 2, total, f"{next(counter)}")
        figures = alternate_many(contenders, rounds)
    raw, floor = figures[RAW]["events/s"], figures[FLOOR]["events/s"]
    rows = [figures[name]["events/s"].row(None if name == RAW else raw) for name in contenders]
    rows += [figures[name]["events/s"].row(floor) for name in contenders if name not in (RAW, FLOOR)]
    section.add_table(f"a backlog of {total:,} events (8 runs, chunks of {CHUNK:,} lines, 8 partitions) drained, "
                      f"events/s, {rounds} rounds", rows)
    for unit in (READER_CPU, SERVERS_CPU):
        ref = figures[FLOOR][unit]
        section.add_table(f"{unit}: CPU time over the same window per event drained (the reader: its own process or "
                          "processes; the servers: the three nats-servers)",
                          [figures[name][unit].row(None if name == FLOOR else ref) for name in contenders])
    one = figures[ONE]["events/s"].median / raw.median
    section.target("issue 27: one consuming relay >= 50% of nats-py fetch + ack (same-run medians)", one, 0.5, True,
                   f"{one:.0%} ({figures[ONE]['events/s'].median:,.0f} vs {raw.median:,.0f} events/s)")
    fair = figures[ONE]["events/s"].median / floor.median
    section.target("issue 40: one consuming relay >= 60% of the fair floor, fetch -> file -> ack (same-run "
                   "medians)", fair, 0.6, True, f"{fair:.0%} ({figures[ONE]['events/s'].median:,.0f} vs "
                   f"{floor.median:,.0f} events/s; the floor is {floor.median / raw.median:.0%} of nats-py alone)")
    if TWO in figures:
        both = figures[TWO]["events/s"].median / figures[ONE]["events/s"].median
        section.target("issue 40: two consuming relays (8 partitions, 4 each) >= 1.6x one (same-run "
                       "medians)", both, 1.6, True, f"{both:.2f}x")
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
