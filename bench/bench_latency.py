"""Latency: from ``publish()`` to the event's line in the JSONL journal, at default settings.

Eight ranks, each its own process with a real Publisher, log a metrics event every 100 ms (a
realistic rate), then every 10 ms (10x). A reader in this process follows the journal (every
millisecond) and, for each new line, takes the time it saw the line minus the event's ``ts``
(stamped by ``publish()``); both clocks are this machine's ``time.time()``.

    python -m bench.bench_latency [--quick]
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import orjson

from bench import procs
from bench.common import RelayRun, Section, cli, kill_group, percentile

RANKS = 8


class JournalFollower(threading.Thread):
    """Collects publish-to-line latencies (seconds) of metrics events as lines appear."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.latencies: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.path.exists() and not self.stop.wait(0.001):
            pass
        if not self.path.exists():
            return
        fd = os.open(self.path, os.O_RDONLY)
        rest = b""
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if chunk:
                    seen = time.time()
                    lines = (rest + chunk).split(b"\n")
                    rest = lines.pop()
                    for line in lines:
                        event = orjson.loads(line)
                        if event["type"] == "metrics":
                            self.latencies.append(seen - event["ts"])
                elif self.stop.wait(0.001):
                    return
        finally:
            os.close(fd)


def measure(work: Path, rate: float, seconds: float) -> dict:
    """One relay at default settings, RANKS rank processes at ``rate`` Hz each for ``seconds``."""
    journal = work / f"latency-{rate:g}hz.jsonl"
    relay = RelayRun(work, ["--path", str(journal)])
    follower = JournalFollower(journal)
    follower.start()
    hosts = []
    try:
        hosts = [procs.start(["ranks", relay.address, f"latency-{rate:g}", str(r), "1", str(RANKS), str(rate),
                              str(seconds)]) for r in range(RANKS)]
        procs.await_ready(hosts)
        procs.go(hosts)
        results = [procs.result(h, seconds + 90) for h in hosts]
        time.sleep(0.3)  # the follower's last look
    finally:
        follower.stop.set()
        follower.join(5)
        for h in hosts:
            kill_group(h)
        relay.stop()
    lat = follower.latencies
    expected = sum(n for r in results for n in r["published"].values()) - 2 * RANKS  # minus hello + stats
    return {"rate": rate, "events": len(lat), "expected": expected, "p50": percentile(lat, 50),
            "p99": percentile(lat, 99), "max": max(lat), "dropped": sum(r["dropped"] for r in results),
            "latencies": lat}


def run(quick: bool = False) -> Section:
    seconds = 1.0 if quick else 12.0
    section = Section("latency", "Latency: publish() to the line in the journal")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        for label, rate in (("realistic: every 100 ms per rank", 10.0), ("10x: every 10 ms per rank", 100.0)):
            m = measure(Path(tmp), rate, seconds)
            rows.append({"load": label, "events/s": RANKS * rate, "events": m["events"], "p50": m["p50"],
                         "p99": m["p99"], "max": m["max"]})
            section.data[f"{rate:g}"] = sorted(m["latencies"])
            section.target(f"p99 < 100 ms ({label})", m["p99"] * 1e3, 100, False, f"{m['p99'] * 1e3:.1f} ms")
            if m["events"] != m["expected"] or m["dropped"]:
                section.notes.append(f"{label}: saw {m['events']} of {m['expected']} events, {m['dropped']} dropped")
    section.data["rows"] = rows
    section.markdown.append("\n".join(
        ["| load | events/s (all ranks) | events seen | p50 | p99 | max |", "|---|---|---|---|---|---|"]
        + [f"| {r['load']} | {r['events/s']:g} | {r['events']:,} | {r['p50'] * 1e3:.1f} ms | {r['p99'] * 1e3:.1f} ms "
           f"| {r['max'] * 1e3:.1f} ms |" for r in rows]))
    section.notes.append(f"{RANKS} rank processes, {seconds:g} s per load, relay defaults (--flush-interval 50 ms, "
                         "client send interval 10 ms): the two periods bound the latency by design.")
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
