"""The Prometheus endpoint's cost to ingest: events/s into the JSONL journal from 4 publisher processes,
a relay without the endpoint against one with it (``--metrics-bind``) scraped every second for the
whole feed, and one that also keeps each run's loss (``--metrics-loss``: every event of the feed
passes through the run health then, the worst case), alternating round by round.

The feed is bench/bench_ingest.py's: 512-event compact frames of ``stage="train"`` metrics, as fast as
the socket takes them; the clock runs until the journal holds every event. A scraper thread in this
process GETs /metrics once a second from the start of the feed to its end and counts its answers.

End to end the rates swing with the machine's load, so the relay process's own CPU per event (all its
threads: ingest, the endpoint's, ZeroMQ's) is taken over the same feed: the rate a core would allow.
A last table measures what the run health
adds to ingest's own CPU, in one process without sockets: frames of nothing but ``stage="rank"``
reports of a 64-rank run (each event through the cross-rank derivation and, with the endpoint, the
run health: the worst case, where a real job sends one such event per rank per logged step) through
``Ingest.take_frame`` and the commit step, the health off and on, alternating round by round.

    python -m bench.bench_metrics [--quick]
"""
from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil

from bench.bench_ingest import _timed_feed
from bench.common import RelayRun, Sample, Section, alternate_many, cli, free_port
from relay.daemon.cross_rank import ClusterConfig
from relay.daemon.ingest import Ingest
from relay.daemon.run_health import RunHealth
from relay.journal.deadletter import DeadLetters
from relay.journal.journal import Journal
from relay.wire import encoding

PLAIN, SCRAPED = "relay, no endpoint", "relay, endpoint scraped every 1 s"
LOSS = "relay, --metrics-loss, scraped every 1 s"
PUBLISHERS = 4


class Scraper(threading.Thread):
    """GET ``url`` every ``period`` seconds until stopped; ``answers`` counts the 200s, ``failures`` the rest."""

    def __init__(self, url: str, period: float = 1.0) -> None:
        super().__init__(name="scraper", daemon=True)
        self.url, self.period = url, period
        self.answers = self.failures = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=5) as answer:
                    answer.read()
                    self.answers += answer.status == 200
            except OSError:
                self.failures += 1
            self.done.wait(self.period)


def _rate(work: Path, total: int, endpoint: list[str] | None) -> dict[str, float]:
    journal = work / f"j{time.monotonic_ns()}.jsonl"
    port = free_port()
    relay = RelayRun(work, ["--path", str(journal), *(["--metrics-bind", str(port), *endpoint] if endpoint is not None
                                                        else [])])
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics") if endpoint is not None else None
    try:
        if scraper is not None:
            scraper.start()
        process = psutil.Process(relay.pid)
        before = sum(process.cpu_times()[:2])
        seconds = _timed_feed("dealer", relay.address, journal.stem, PUBLISHERS, total, journal, relay.check_alive)
        out = {"events/s": total / seconds, "relay CPU us/event": (sum(process.cpu_times()[:2]) - before) / total * 1e6}
        if scraper is not None:
            scraper.done.set()
            scraper.join(10)
            if scraper.failures or not scraper.answers:
                raise RuntimeError(f"scrapes: {scraper.answers} answered, {scraper.failures} failed")
            out["scrapes"] = scraper.answers
        return out
    finally:
        relay.stop(30.0)


def _rank_frames(ranks: int, steps: int, per_frame: int = 32) -> list[tuple[bytes, bytes]]:
    """(peer, frame): each rank's stage="rank" reports, ``per_frame`` logged steps to a frame."""
    out = []
    for rank in range(ranks):
        prefix = encoding.compact_prefix({"v": 1, "run": "bench", "rank": rank, "local_rank": rank % 8,
                                          "world_size": ranks, "host": "h"})
        for first in range(0, steps, per_frame):
            rows = [encoding.encode_row(step, 1.0 + step, "metrics", step + 1, None, "rank",
                                        {"step_time": 0.1 + rank / 1000, "own_time": 0.05, "steps": 1})
                    for step in range(first, min(steps, first + per_frame))]
            out.append((b"peer%d" % rank, encoding.compact_frame(prefix, rows)))
    return out


def _cpu_per_event(frames: list[tuple[bytes, bytes]], folder: str, health: bool) -> float:
    """Microseconds of this process's CPU per event: every frame taken, a commit every 8 frames."""
    journal = Journal(os.path.join(folder, f"j{time.monotonic_ns()}") + os.sep)
    journal.open()
    ingest = Ingest(journal, DeadLetters(journal.sidecar("_deadletter.jsonl")), 0.0, cluster=ClusterConfig(),
                    health=RunHealth() if health else None, send_acks=lambda peer, acks: None)  # as before: no acks
    events = 0
    t0 = time.process_time()
    for i, (peer, frame) in enumerate(frames):
        ingest.take_frame(peer, frame, i * 0.001)
        if i % 8 == 7:
            ingest.commit(i * 0.001)
    ingest.commit(len(frames) * 0.001)
    took = time.process_time() - t0
    events = ingest.counters.events
    journal.close()
    ingest.deadletters.close()
    return took / events * 1e6


def _in_process(section: Section, quick: bool) -> None:
    ranks, steps, rounds = (8, 64, 3) if quick else (64, 1024, 9)
    frames = _rank_frames(ranks, steps)
    off, on = [], []
    with tempfile.TemporaryDirectory(prefix="bench-metrics-cpu-") as folder:
        for r in range(rounds):
            for health in ((False, True) if r % 2 == 0 else (True, False)):
                (on if health else off).append(_cpu_per_event(frames, folder, health))
    base = Sample("ingest, cross-rank on, no endpoint", "us/event", off)
    with_health = Sample("ingest, cross-rank on, run health kept", "us/event", on)
    section.add_table(f"in-process CPU per event, {ranks} ranks x {steps:,} stage=\"rank\" reports (worst case)",
                      [base.row(), with_health.row(base)])
    ratio = statistics.median(a / b for a, b in zip(off, on, strict=True))
    section.target("in process, rank reports only: ingest rate with the run health >= 95% of without (median "
                   "same-round ratio)", ratio, 0.95, True, f"{ratio:.0%}")


def run(quick: bool = False) -> Section:
    total, rounds = (20_000, 1) if quick else (300_000, 5)
    section = Section("metrics", "Prometheus endpoint: ingest with the endpoint scraped every second")
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        work = Path(tmp)
        contenders: dict[str, Callable[[], dict[str, float]]] = {
            PLAIN: lambda: _rate(work, total, None),
            SCRAPED: lambda: _rate(work, total, []),
            LOSS: lambda: _rate(work, total, ["--metrics-loss"]),
        }
        samples = alternate_many(contenders, rounds)
    base = samples[PLAIN]["events/s"]
    section.add_table(f"{PUBLISHERS} publisher processes, {total:,} events per round",
                      [base.row()] + [samples[name]["events/s"].row(base) for name in (SCRAPED, LOSS)])
    cpu = samples[PLAIN]["relay CPU us/event"]
    section.add_table("the relay process's CPU (user + system, every thread) per event, same rounds",
                      [cpu.row()] + [samples[name]["relay CPU us/event"].row(cpu) for name in (SCRAPED, LOSS)])
    for name, what in ((SCRAPED, "scraped every second"), (LOSS, "--metrics-loss, scraped every second")):
        with_endpoint = samples[name]["relay CPU us/event"].values
        held = statistics.median(a / b for a, b in zip(cpu.values, with_endpoint, strict=True))
        section.target(f"relay CPU per event without / with the endpoint ({what}) >= 95% (median same-round "
                       "ratio: the rate it allows on an idle core)", held, 0.95, True, f"{held:.0%}")
    for name, what in ((SCRAPED, "with the endpoint scraped every second"), (LOSS, "with --metrics-loss as well")):
        held = Sample(f"{name} / without, same round", "x", [a / b for a, b in zip(
            samples[name]["events/s"].values, base.values, strict=True)])
        section.target(f"ingest {what} >= 95% of without (median same-round ratio)", held.median, 0.95, True,
                       f"{held.median:.0%} (rounds {', '.join(f'{v:.0%}' for v in held.values)})")
    scrapes = ", ".join(f"{name}: {samples[name]['scrapes'].median:.0f}" for name in (SCRAPED, LOSS))
    section.notes.append(f"{rounds} rounds per contender, alternating, each a fresh relay and fresh publishers; "
                         f"scrapes answered per round (median): {scrapes}.")
    _in_process(section, quick)
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
