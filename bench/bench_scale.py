"""Scale: 64, 256 and 1,024 simulated ranks logging into one relay; its CPU and resident memory,
and a check that the journal holds every event exactly once.

Ranks are real Publishers, each its own rank with its own DEALER socket, spread over four
processes (one shared I/O thread per process). Each logs a typical metrics event every 100 ms.
The relay's CPU (user + system) is taken over the publishing window and its RSS sampled every
half second; afterwards every rank's sequence numbers in the journal must be exactly
0..published-1: no loss, no duplicate.

    python -m bench.bench_scale [--quick]
"""
from __future__ import annotations

import collections
import tempfile
import time
from pathlib import Path

import orjson
import psutil

from bench import procs
from bench.common import RelayRun, Section, cli, kill_group

HOSTS = 4
RATE = 10.0


def _check_journal(journal: Path, published: dict[int, int]) -> tuple[int, int]:
    """(lost, duplicated) events over all ranks, comparing the journal with what ranks published."""
    seqs: dict[int, list[int]] = collections.defaultdict(list)
    with open(journal, "rb") as fh:
        for line in fh:
            event = orjson.loads(line)
            seqs[event["rank"]].append(event["seq"])
    lost = dup = 0
    for rank, count in published.items():
        got = seqs.pop(rank, [])
        distinct = set(got)
        dup += len(got) - len(distinct)
        lost += count - len(distinct & set(range(count)))
    dup += sum(len(v) for v in seqs.values())  # ranks nobody published
    return lost, dup


def measure(work: Path, ranks: int, seconds: float) -> dict:
    journal = work / f"scale-{ranks}.jsonl"
    relay = RelayRun(work, ["--path", str(journal)])
    proc = psutil.Process(relay.pid)
    rss_idle = proc.memory_info().rss
    per_host = ranks // HOSTS
    hosts = []
    try:
        hosts = [procs.start(["ranks", relay.address, f"scale-{ranks}", str(h * per_host), str(per_host), str(ranks),
                              str(RATE), str(seconds)]) for h in range(HOSTS)]
        procs.await_ready(hosts, timeout=300)
        rss_connected = proc.memory_info().rss
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        procs.go(hosts)
        rss_max, cpu_window, timeline = rss_connected, None, []
        deadline = t0 + seconds + 180
        while any(h.poll() is None for h in hosts) and time.monotonic() < deadline:
            time.sleep(0.5)
            rss = proc.memory_info().rss
            rss_max = max(rss_max, rss)
            timeline.append((time.monotonic() - t0, rss / (1 << 20)))
            if cpu_window is None and time.monotonic() >= t0 + seconds:
                cpu_window = (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        results = [procs.result(h, 30) for h in hosts]
        cpu_total = sum(proc.cpu_times()[:2]) - cpu0  # every event is written and acknowledged by now
        rss_end = proc.memory_info().rss
    finally:
        for h in hosts:
            kill_group(h)
        relay.stop()
    published = {int(rank): n for r in results for rank, n in r["published"].items()}
    lost, dup = _check_journal(journal, published)
    mib = 1 << 20
    events = sum(published.values())
    return {"ranks": ranks, "events": events, "cpu": 100 * (cpu_window or 0.0), "cpu_us_per_event": cpu_total / events * 1e6,
            "rss_idle": rss_idle / mib, "rss_connected": rss_connected / mib, "rss_max": rss_max / mib,
            "rss_end": rss_end / mib, "lost": lost, "duplicated": dup,
            "client_dropped": sum(r["dropped"] for r in results), "unacked": sum(r["unacked"] for r in results),
            "behind_s": max(r["behind_s"] for r in results), "timeline": timeline}


def run(quick: bool = False) -> Section:
    sizes = ((8, 1.5), (16, 1.5)) if quick else ((64, 15.0), (256, 15.0), (1024, 60.0))
    section = Section("scale", "Scale: simulated ranks into one relay")
    points = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for ranks, seconds in sizes:
            m = measure(Path(tmp), ranks, seconds)
            m["seconds"] = seconds
            points.append(m)
            section.target(f"{ranks} ranks: zero events lost or duplicated", m["lost"] + m["duplicated"]
                           + m["client_dropped"] + m["unacked"], 0, False,
                           f"{m['events']:,} events: {m['lost']} lost, {m['duplicated']} duplicated, "
                           f"{m['client_dropped']} dropped by clients")
    section.data["points"] = points
    section.markdown.append("\n".join(
        ["| ranks | events | seconds | relay CPU | relay CPU per event | RSS before ranks | RSS ranks connected "
         "| RSS max | lost | duplicated |", "|---|---|---|---|---|---|---|---|---|---|"]
        + [f"| {p['ranks']:,} | {p['events']:,} | {p['seconds']:g} | {p['cpu']:.1f}% of a core "
           f"| {p['cpu_us_per_event']:.0f} us | {p['rss_idle']:.1f} MiB | {p['rss_connected']:.1f} MiB "
           f"| {p['rss_max']:.1f} MiB | {p['lost']} | {p['duplicated']} |" for p in points]))
    first, last = points[0], points[-1]
    per_rank_kib = (last["rss_connected"] - first["rss_connected"]) * 1024 / (last["ranks"] - first["ranks"])
    section.notes.append(f"{HOSTS} processes host the ranks; each rank logs every {1 / RATE * 1e3:.0f} ms. "
                         f"With every rank connected, relay memory grows by about {per_rank_kib:.0f} KiB per rank "
                         f"({first['ranks']} -> {last['ranks']} ranks); RSS max above that is frames queued in "
                         "ZeroMQ while the relay was behind.")
    section.notes.append("What bounds the relay's memory, by design: per (run, rank) a dedupe floor plus at most "
                         "65,536 seqs above it and one route entry; per connected peer at most 64 frames queued in "
                         "ZeroMQ (RCVHWM); at most 16 MiB of lines (or 200,000 events) waiting for the journal "
                         "before a commit (then, while the journal fails, it stops reading and clients keep their "
                         "events) and 200,000 events per other sink (then that sink's batches are dropped, counted). "
                         "RSS stays within --max-memory plus 256 MiB (docs/relay.md, memory).")
    behind = [p for p in points if p["rss_max"] > 2 * p["rss_connected"]]
    if behind:
        section.notes.append(f"At {behind[-1]['ranks']:,} ranks the relay fell behind at times (each rank's event is "
                             "its own frame and gets its own ack, so the relay's cost is per frame: "
                             f"{behind[-1]['cpu_us_per_event']:.0f} us), sharing 2 cores with the 4 processes "
                             "simulating the ranks and with other work; ZeroMQ queued the frames (bounded per peer, "
                             "above) and the relay caught up without losing any.")
    if any(p["behind_s"] > 1.0 for p in points):
        section.notes.append("the rank processes fell behind their schedule by up to "
                             f"{max(p['behind_s'] for p in points):.1f} s (machine saturated)")
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
