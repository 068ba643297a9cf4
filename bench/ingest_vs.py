"""Ingest's CPU per event, this tree against another checkout of the project (e.g. ``git worktree add
/tmp/before <commit>``, or ``git archive <commit> | tar -x -C /tmp/before``): each round runs
bench/ingest_cpu.py's ingest round (``take_frame`` and the commit step into a real journal) three
times in a fresh process of each tree, in turn, who goes first alternating; the process's CPU
seconds, not the wall clock, which on a shared machine counts other processes' turns.

``--derive``: a rank-stage step_time event every 8 events, as a trainer sends (every frame then has
events for the cross-rank derivation); ``--health``: ingest follows runs' health, as with the
Prometheus endpoint on (``RunHealth(loss=True)``).

    python -m bench.ingest_vs --baseline DIR [--events N] [--rounds R] [--derive] [--health]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT

#: Run in the tree under test: its own ingest_cpu, its own relay.
CHILD = """
import gc, sys, tempfile, time
import bench.ingest_cpu
from bench.ingest_cpu import _ingest
from bench.procs import DATA, frames
from relay.daemon.run_health import RunHealth
from relay.wire import encoding
events, publishers, derive, health = int(sys.argv[1]), 4, sys.argv[2] == "1", sys.argv[3] == "1"

def trainer_frames(rank, count):
    envelope = {"v": 1, "run": "bench", "rank": rank, "local_rank": rank, "world_size": 16,
                "host": "bench"}
    rows = [(s, time.time(), "metrics", s // 8, 0.5, "rank" if s % 8 == 7 else "train",
             {"step_time": 0.2, "own_time": 0.15} if s % 8 == 7 else DATA) for s in range(count)]
    return [encoding.compact_frame(encoding.compact_prefix(envelope),
                                   [encoding.encode_row(*row) for row in rows[i:i + 512]])
            for i in range(0, count, 512)]

class Watched(bench.ingest_cpu.Ingest):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.follow_health(RunHealth(loss=True))

if health:
    bench.ingest_cpu.Ingest = Watched
make = trainer_frames if derive else lambda rank, count: frames("bench", rank, count)[0]
groups = [make(rank, events // publishers) for rank in range(publishers)]
blobs = [blob for together in zip(*groups) for blob in together]
peers = [b"peer%d" % rank for rank in range(publishers)]
gc.freeze()
gc.set_threshold(50_000, 20, 20)
with tempfile.TemporaryDirectory(prefix="bench-ingest-vs-") as folder:
    for _ in range(3):
        t0 = time.process_time()
        _ingest(blobs, peers, folder)
        print((time.process_time() - t0) / events * 1e6)
"""


def _round(tree: Path, events: int, derive: bool, health: bool) -> float:
    """The median of three ingest rounds in a fresh process of ``tree``, CPU microseconds per event."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-c", CHILD, str(events), str(int(derive)), str(int(health))]
    out = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=600,
                         check=True).stdout
    return statistics.median(map(float, out.split()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, type=Path, help="another checkout of the project")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--derive", action="store_true",
                        help="a rank-stage event every 8, as a trainer sends")
    parser.add_argument("--health", action="store_true",
                        help="ingest follows runs' health (Prometheus on)")
    args = parser.parse_args()
    ours: list[float] = []
    base: list[float] = []
    for turn in range(args.rounds):
        for tree, into in ((ROOT, ours), (args.baseline, base))[::1 if turn % 2 else -1]:
            into.append(_round(tree, args.events, args.derive, args.health))
    ratios = [b / o for o, b in zip(ours, base, strict=True)]
    print(f"{args.events:,} events, {args.rounds} rounds: this tree {statistics.median(ours):.3f} us/event (CPU), "
          f"baseline {statistics.median(base):.3f}; this tree's rate / the baseline's, same round: median "
          f"{statistics.median(ratios):.0%} (rounds {', '.join(f'{r:.0%}' for r in ratios)})")


if __name__ == "__main__":
    main()
