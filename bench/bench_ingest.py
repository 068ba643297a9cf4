"""Ingest: events/s one relay writes to its JSONL journal from 1, 4 and 16 publisher processes,
alone, with the Aim sink attached and with all five sinks attached, against a raw pyzmq PULL + orjson
writer fed the same frames.

Every publisher process sends the frames a Publisher would (512 metrics events of its own rank per
frame), pre-encoded, as fast as the socket takes them, so the sink side is what is measured. The
clock runs from the moment all publishers are released until the sink has written every event
(both write the same JSON lines, so that is when the file reaches the size the publishers expect).

    python -m bench.bench_ingest [--quick]
"""
from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import procs
from bench.common import RelayRun, Sample, Section, alternate_many, cli, kill_group
from relay.journal.journal import Journal

RELAY, RELAY_AIM, RAW = "relay, JSONL", "relay, JSONL + Aim sink", "raw PULL + orjson writer"
RELAY_ALL = "relay, JSONL + all five sinks"
#: Every other sink of this repository, each writing under the round's folder.
ALL_SINKS = ("aim", "mlflow", "tensorboard", "wandb", "clearml")


def _sink_args(names: tuple[str, ...], work: Path) -> list[str]:
    options = {"aim": ["--repo", str(work / "aim")],
               "mlflow": ["--mlflow-tracking-uri", f"sqlite:///{work / 'mlflow.db'}", "--mlflow-experiment", "bench"],
               "tensorboard": ["--logdir", str(work / "tb")],
               "wandb": ["--wandb-project", "bench", "--wandb-dir", str(work / "wandb")],
               "clearml": ["--clearml-project", "bench", "--clearml-dir", str(work / "clearml")]}
    return [arg for name in names for arg in ("--sink", name, *options[name])]


def _timed_feed(kind: str, address: str, run: str, publishers: int, total: int, out: Path,
                alive: Callable[[], None]) -> float:
    """Start the publishers, release them together, return the seconds until ``out`` holds every line
    (``alive`` raises if the sink process died meanwhile)."""
    feeders = [procs.start(["feed", kind, address, run, str(rank), str(total // publishers)])
               for rank in range(publishers)]
    try:
        expected = sum(int(line.split()[1]) for line in procs.await_ready(feeders))
        t0 = time.perf_counter()
        procs.go(feeders)
        deadline = time.monotonic() + 60
        while not out.exists() or out.stat().st_size < expected:
            if time.monotonic() > deadline:
                size = out.stat().st_size if out.exists() else 0
                left = [f"rank {rank}: exit {proc.poll()}" for rank, proc in enumerate(feeders)
                        if proc.poll() != 0]
                raise RuntimeError(f"{out} has {size} of {expected} bytes ({total} events) after 60 s; publishers "
                                   f"not done: {', '.join(left) or 'none'}; {_relay_counters(out)}")
            alive()
            time.sleep(0.002)
        return time.perf_counter() - t0
    finally:
        for proc in feeders:
            kill_group(proc)


def _relay_counters(journal: Path) -> str:
    """The relay's own counters beside ``journal`` (what a stalled round needs to be understood)."""
    try:
        stats = json.loads(Journal(journal).sidecar("_stats.json").read_text())
    except (OSError, ValueError):
        return "no relay stats"
    keys = ("frames", "events", "written", "duplicates", "rejected", "journal_errors")
    return "relay stats: " + ", ".join(f"{key} {stats.get(key)}" for key in keys)


def _relay_rate(work: Path, publishers: int, total: int, sinks: tuple[str, ...] = ()) -> dict[str, float]:
    journal = work / f"j{time.monotonic_ns()}.jsonl"
    relay = RelayRun(work, ["--path", str(journal), "--stats-interval", "0.1", *_sink_args(sinks, work)])
    try:
        out = {"events/s": total / _timed_feed("dealer", relay.address, journal.stem, publishers, total, journal,
                                                  relay.check_alive)}
        if sinks:
            time.sleep(0.2)  # one stats period
            written = json.loads(Journal(journal).sidecar("_stats.json").read_text())["sinks"]
            out.update({f"{name} written": written[name]["written"] for name in sinks})
        return out
    finally:
        relay.stop(3.0 if sinks else 30.0)  # the sinks would drain their backlog for up to 10 s


def _raw_rate(work: Path, publishers: int, total: int) -> dict[str, float]:
    out = work / f"raw{time.monotonic_ns()}.jsonl"
    sink = procs.start(["raw-sink", str(out), str(total)])
    try:
        address = procs.await_ready([sink])[0]
        def alive() -> None:
            if sink.poll() not in (None, 0):
                raise RuntimeError(f"raw writer exited {sink.returncode}")

        return {"events/s": total / _timed_feed("push", address, "raw", publishers, total, out, alive)}
    finally:
        kill_group(sink)


def run(quick: bool = False) -> Section:
    """For each publisher count, alternate the four contenders round by round."""
    counts, total, rounds = ((2,), 6_000, 1) if quick else ((1, 4, 16), 200_000, 5)
    section = Section("ingest", "Ingest: events/s into the JSONL journal")
    curve = {}
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        for n in counts:
            work = Path(tmp) / f"p{n}"
            contenders: dict[str, Callable[[], dict[str, float]]] = {
                RELAY: lambda n=n, work=work: _relay_rate(work, n, total),
                RELAY_AIM: lambda n=n, work=work: _relay_rate(work, n, total, ("aim",)),
                RELAY_ALL: lambda n=n, work=work: _relay_rate(work, n, total, ALL_SINKS),
                RAW: lambda n=n, work=work: _raw_rate(work, n, total),
            }
            samples = alternate_many(contenders, rounds)
            base = samples[RAW]["events/s"]
            rows = [base.row()] + [samples[name]["events/s"].row(base) for name in (RELAY, RELAY_AIM, RELAY_ALL)]
            section.add_table(f"{n} publisher process{'es' if n > 1 else ''}, {total:,} events", rows)
            relay = samples[RELAY]["events/s"].median
            section.target(f">= 80% of the raw writer ({n} publishers)", relay / base.median, 0.8, True,
                           f"{relay / base.median:.0%} ({relay:,.0f} vs {base.median:,.0f} ev/s)")
            held = Sample("with Aim / without, same round", "x", [a / b for a, b in zip(
                samples[RELAY_AIM]["events/s"].values, samples[RELAY]["events/s"].values,
                strict=True)])
            section.target(f"JSONL rate holds with the Aim sink attached ({n} publishers, >= 90%, median same-round "
                           "ratio)", held.median, 0.9, True,
                           f"{held.median:.0%} (rounds {', '.join(f'{v:.0%}' for v in held.values)})")
            every = Sample("with all five sinks / without, same round", "x", [a / b for a, b in zip(
                samples[RELAY_ALL]["events/s"].values, samples[RELAY]["events/s"].values,
                strict=True)])
            section.target(f"JSONL rate holds with all five sinks attached ({n} publishers, >= 90%, median "
                           "same-round ratio)", every.median, 0.9, True,
                           f"{every.median:.0%} (rounds {', '.join(f'{v:.0%}' for v in every.values)})")
            aim_done = samples[RELAY_AIM]["aim written"].median
            caught = ", ".join(f"{name} {samples[RELAY_ALL][f'{name} written'].median:,.0f}" for name in ALL_SINKS)
            section.notes.append(f"{n} publishers: when the journal had all {total:,} events the Aim sink alone had "
                                 f"written {aim_done:,.0f} of them, and with all five attached: {caught} (they "
                                 "catch up off the ingest path).")
            curve[n] = {name: samples[name]["events/s"].median for name in (RELAY, RELAY_AIM, RELAY_ALL, RAW)}
            if n == 1:
                section.target("issue 2: ingest >= 100,000 events/s", relay, 100_000, True, f"{relay:,.0f} ev/s")
    section.data["curve"] = curve
    section.notes.append(f"{rounds} rounds per contender, alternating; each round starts a fresh relay (or raw "
                         "writer) and fresh publisher processes.")
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
