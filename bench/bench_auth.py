"""Authentication's cost to ingest: a TCP relay as it runs by default (CURVE keys from the user's
relay secret, every byte encrypted both ways, relay/daemon/gate.py) against the same relay with
``--open`` (no authentication, no encryption), alternating round by round.

The publishers are bench_ingest's: processes sending the frames a Publisher would (512 metrics
events of one rank each), pre-encoded, as fast as the socket takes them, each proving itself as a
Publisher does (relay/wire/auth.py); the open rounds set ``RELAY_OPEN=1`` for the relay and the
publishers alike, as a user would. The clock runs from their release until the journal holds every
event. Target: with authentication >= 90% of without (median of the same-round ratios). Beside it,
the relay process's CPU per event (all its threads: ingest, and ZeroMQ's I/O thread that decrypts),
which a shared machine's load disturbs less than the wall clock.

    python -m bench.bench_auth [--quick]
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import psutil

from bench.bench_ingest import _timed_feed
from bench.common import RelayRun, Sample, Section, alternate_many, cli
from relay.wire.auth import OPEN_ENV

SECRET, OPEN = "relay, authenticated (default: the user's secret, CURVE)", "relay, --open (no authentication)"


def _rate(work: Path, publishers: int, total: int, run_open: bool) -> dict[str, float]:
    """One round: a fresh relay and fresh publishers; events/s until the journal holds them all."""
    journal = work / f"j{time.monotonic_ns()}.jsonl"
    was_open = os.environ.pop(OPEN_ENV, None)
    if run_open:
        os.environ[OPEN_ENV] = "1"  # the relay (--open) and the publishers it starts inherit it
    try:
        relay = RelayRun(work, ["--path", str(journal), "--stats-interval", "0.1"])
        try:
            proc = psutil.Process(relay.pid)
            cpu_before = sum(proc.cpu_times()[:2])
            seconds = _timed_feed("dealer", relay.address, journal.stem, publishers, total, journal, relay.check_alive)
            cpu = sum(proc.cpu_times()[:2]) - cpu_before
            return {"events/s": total / seconds, "s": cpu / total}
        finally:
            relay.stop(30.0)
    finally:
        os.environ.pop(OPEN_ENV, None)
        if was_open is not None:
            os.environ[OPEN_ENV] = was_open


def run(quick: bool = False) -> Section:
    counts, total, rounds = ((2,), 20_000, 1) if quick else ((1, 4), 200_000, 7)  # quick: CPU ticks are 10 ms
    section = Section("auth", "Authentication by default: ingest with the relay secret (CURVE) vs --open")
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        for n in counts:
            work = Path(tmp) / f"p{n}"
            samples = alternate_many({
                SECRET: lambda n=n, work=work: _rate(work, n, total, run_open=False),
                OPEN: lambda n=n, work=work: _rate(work, n, total, run_open=True),
            }, rounds)
            base, cpu_base = samples[OPEN]["events/s"], samples[OPEN]["s"]
            what = f"{n} publisher process{'es' if n > 1 else ''}, {total:,} events"
            section.add_table(f"{what} into the journal", [base.row(), samples[SECRET]["events/s"].row(base)])
            section.add_table(f"{what}: the relay process's CPU per event (all its threads)",
                              [cpu_base.row(), samples[SECRET]["s"].row(cpu_base)])
            held = Sample("authenticated / open, same round", "x", [a / b for a, b in zip(
                samples[SECRET]["events/s"].values, base.values, strict=True)])
            section.target(f"ingest authenticated >= 90% of --open ({n} publishers, median same-round ratio)",
                           held.median, 0.9, True,
                           f"{held.median:.0%} (rounds {', '.join(f'{v:.0%}' for v in held.values)})")
            cost = Sample("CPU per event, authenticated / open, same round", "x", [a / b for a, b in zip(
                samples[SECRET]["s"].values, cpu_base.values, strict=True)])
            section.notes.append(f"{n} publishers: the relay's CPU per event authenticated / --open, median of the "
                                 f"same-round ratios {cost.median:.2f}x (rounds "
                                 f"{', '.join(f'{v:.2f}' for v in cost.values)}).")
    section.notes.append(f"{rounds} rounds per contender, alternating; each round starts a fresh relay and fresh "
                         "publisher processes. Encryption runs on ZeroMQ's I/O threads (the relay's and each "
                         "publisher's), beside the relay's ingest thread.")
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
