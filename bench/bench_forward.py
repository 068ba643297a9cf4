"""Two hops: events/s from publisher processes through a node relay and its forward sink into a
central relay's journal, against the same publishers writing into the central relay directly.

Each round starts fresh relays (one hop: the central alone; two hops: a node relay with
``--sink forward --to`` the central) and releases the same pre-encoded frames bench_ingest sends
(512 metrics events per frame, one rank per publisher process). The clock runs until the central's
journal holds every event (the forwarded lines are the node's own, byte for byte, so that is when
the file reaches the size the publishers expect). After each two-hop round the central's lines are
compared with the node's: the target is that they are the same lines, none lost or doubled.

    python -m bench.bench_forward [--quick]
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.bench_ingest import _timed_feed
from bench.common import RelayRun, Section, alternate_many, cli

ONE, TWO = "one hop: publishers -> central relay", "two hops: publishers -> node relay -> forward -> central relay"


def _one_hop(work: Path, publishers: int, total: int) -> dict[str, float]:
    journal = work / f"central-{time.monotonic_ns()}.jsonl"
    central = RelayRun(work / "central", ["--path", str(journal)])
    try:
        seconds = _timed_feed("dealer", central.address, journal.stem, publishers, total, journal,
                              central.check_alive)
        return {"events/s": total / seconds}
    finally:
        central.stop()


def _two_hops(work: Path, publishers: int, total: int, mismatches: list[int]) -> dict[str, float]:
    journal = work / f"central-{time.monotonic_ns()}.jsonl"
    node_dir = work / f"node-{time.monotonic_ns()}"
    central = RelayRun(work / "central", ["--path", str(journal)])
    node = RelayRun(work / "node", ["--path", f"{node_dir}/", "--sink", "forward", "--to", central.address])

    def alive() -> None:
        central.check_alive()
        node.check_alive()

    try:
        seconds = _timed_feed("dealer", node.address, journal.stem, publishers, total, journal, alive)
    finally:
        node.stop()
        central.stop()
    forwarded = sorted(journal.read_bytes().splitlines())
    journaled = sorted((node_dir / f"{journal.stem}.jsonl").read_bytes().splitlines())
    mismatches.append(len(set(forwarded) ^ set(journaled)) + abs(len(forwarded) - len(journaled)))
    return {"events/s": total / seconds}


def run(quick: bool = False) -> Section:
    publishers, total, rounds = (2, 6_000, 1) if quick else (4, 200_000, 5)
    section = Section("forward", "Two hops: node relay -> forward sink -> central relay")
    mismatches: list[int] = []
    with tempfile.TemporaryDirectory(prefix="bench-forward-") as tmp:
        work = Path(tmp)
        samples = alternate_many({ONE: lambda: _one_hop(work / "one", publishers, total),
                                  TWO: lambda: _two_hops(work / "two", publishers, total, mismatches)}, rounds)
    base = samples[ONE]["events/s"]
    two = samples[TWO]["events/s"]
    section.add_table(f"{publishers} publisher processes, {total:,} events, until the central journal holds all",
                      [base.row(), two.row(base)])
    section.target("two hops: the central journal holds exactly the node's lines (none lost or doubled)",
                   sum(mismatches), 0, False, f"{sum(mismatches)} lines differ over {len(mismatches)} rounds")
    section.notes.append(f"two hops / one hop: {two.median / base.median:.0%} ({two.median:,.0f} vs "
                         f"{base.median:,.0f} events/s, medians); {rounds} rounds per contender, alternating, "
                         "each with fresh relays and publisher processes, all on this one machine.")
    section.data = {"one_hop": base.values, "two_hops": two.values}
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
