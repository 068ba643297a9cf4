"""The embedded relay's transport: an ``ipc://`` socket in a private directory against loopback TCP.

The embedded relay listens on ipc so that only the job's user can reach it (issue 9); this
measures what that choice costs or saves. Per round and transport, alternating: a fresh relay, one
Publisher that publishes a burst of events, timed until the relay has acknowledged all of them
(so journaled), and the relay's CPU time per event over the burst.

    python -m bench.bench_transport [--quick]
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import psutil

from bench.common import RelayRun, Section, alternate_many, cli
from relay.client.publisher import Publisher

LOG = {"loss": 1.234, "grad_norm": 0.56, "learning_rate": 2e-5, "entropy": 1.9, "num_tokens": 123456.0}


def burst(bind: str, workdir: Path, events: int) -> dict[str, float]:
    """Events/s from the first publish() to the last acknowledgement, and relay CPU per event."""
    relay = RelayRun(workdir, ["--path", str(workdir / "j.jsonl")], bind=bind)
    try:
        pub = Publisher("transport", 0, address=relay.address, max_events=events + 10)
        pub.publish("metrics", LOG, step=0)
        assert pub.flush(30) == 0, "relay did not acknowledge the first event"
        cpu = psutil.Process(relay.pid)
        cpu_before = sum(cpu.cpu_times()[:2])
        start = time.perf_counter()
        for step in range(events):
            pub.publish("metrics", LOG, step=step, stage="train")
        left = pub.flush(120)
        elapsed = time.perf_counter() - start
        cpu_used = sum(cpu.cpu_times()[:2]) - cpu_before
        pub.close(5)
        assert left == 0, f"{left} events not acknowledged over {bind}"
        return {"events/s": events / elapsed, "s": cpu_used / events}  # (the keys are the units)
    finally:
        relay.stop()


def run(quick: bool = False) -> Section:
    events, rounds = (20_000, 1) if quick else (100_000, 5)  # quick: enough for the CPU clock's 10 ms ticks
    section = Section("transport", "Embedded relay transport: ipc:// in a 0700 directory vs loopback TCP")
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        counter = iter(range(1 << 30))

        def over(kind: str) -> dict[str, float]:
            work = Path(tmp) / f"{kind}-{next(counter)}"
            work.mkdir()
            bind = f"ipc://{work}/relay.sock" if kind == "ipc" else "tcp://127.0.0.1:*"
            return burst(bind, work, events)

        samples = alternate_many({"loopback TCP": lambda: over("tcp"), "ipc socket": lambda: over("ipc")}, rounds)
    for what, unit in (("throughput", "events/s"), ("relay CPU time per event", "s")):
        base = samples["loopback TCP"][unit]
        rows = [base.row(), samples["ipc socket"][unit].row(base)]
        section.add_table(f"{what}: one Publisher, bursts of {events:,} events to full acknowledgement, "
                          f"{rounds} alternating rounds", rows)
    ratio = samples["ipc socket"]["events/s"].median / samples["loopback TCP"]["events/s"].median
    section.target("ipc throughput >= 90% of loopback TCP (medians, alternating rounds)", ratio, 0.9, True,
                   f"{ratio:.2f}x")
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
