"""Ingest's CPU per event, this tree against another checkout of the project (e.g. ``git worktree add
/tmp/before <commit>``, or ``git archive <commit> | tar -x -C /tmp/before``): each round runs
bench/ingest_cpu.py's ingest round (``take_frame`` and the commit step into a real journal) three
times in a fresh process of each tree, in turn, who goes first alternating; the process's CPU
seconds, not the wall clock, which on a shared machine counts other processes' turns.

    python -m bench.ingest_vs --baseline DIR [--events N] [--rounds R]
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
from bench.ingest_cpu import _ingest
from bench.procs import frames
events, publishers = int(sys.argv[1]), 4
groups = [frames("bench", rank, events // publishers)[0] for rank in range(publishers)]
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


def _round(tree: Path, events: int) -> float:
    """The median of three ingest rounds in a fresh process of ``tree``, CPU microseconds per event."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(events)], cwd=tree, env=env, capture_output=True,
                         text=True, timeout=600, check=True).stdout
    return statistics.median(map(float, out.split()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, type=Path, help="another checkout of the project")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    ours: list[float] = []
    base: list[float] = []
    for turn in range(args.rounds):
        for tree, into in ((ROOT, ours), (args.baseline, base))[::1 if turn % 2 else -1]:
            into.append(_round(tree, args.events))
    ratios = [b / o for o, b in zip(ours, base, strict=True)]
    print(f"{args.events:,} events, {args.rounds} rounds: this tree {statistics.median(ours):.3f} us/event (CPU), "
          f"baseline {statistics.median(base):.3f}; this tree's rate / the baseline's, same round: median "
          f"{statistics.median(ratios):.0%} (rounds {', '.join(f'{r:.0%}' for r in ratios)})")


if __name__ == "__main__":
    main()
