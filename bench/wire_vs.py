"""The wire's validation alone, this tree against another checkout of the project (as
bench/ingest_vs.py: fresh processes of each tree in turn, who goes first alternating, CPU time):
``schema.decode`` of bench/schema_cpu.py's three kinds of frame with every event made a dict, and
``ChunkCheck`` over the same events' journal lines as the forward sink (``rows``) and a consuming
relay (``keys``) read them, 1,024 lines a chunk. (bench/schema_cpu.py loads a baseline's schema.py
into this tree, which only works while both share relay/wire/rules.py.)

    python -m bench.wire_vs --baseline DIR [--events N] [--rounds R]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT

#: Run in the tree under test: its own schema and lines, bench/schema_cpu.py's frames.
CHILD = """
import gc, json, statistics, sys, time
from bench.procs import frames
from bench.schema_cpu import _workloads
from relay.wire import schema
from relay.wire.lines import ChunkCheck, encode_lines
events, publishers = int(sys.argv[1]), 4
groups = [frames("bench", rank, events // publishers)[0] for rank in range(publishers)]
blobs = [blob for together in zip(*groups) for blob in together]
lines = [line for blob in blobs for line in encode_lines(schema.decode_frame(blob)).splitlines()]
chunks = [lines[i:i + 1024] for i in range(0, len(lines), 1024)]
check = ChunkCheck(lambda line, why: None)
def each(read, items):
    for item in items:  # nothing kept: what a round keeps alive would weigh on the collector
        read(item)
work = {f"decode, {name}": (lambda b: schema.decode(b).events, frames_)
        for name, frames_ in _workloads(blobs).items()}
work.update({f"ChunkCheck.{name}": (getattr(check, name), chunks) for name in ("rows", "keys")})
gc.freeze()
gc.set_threshold(50_000, 20, 20)
out = {}
for name, (run, data) in work.items():
    took = []
    for _ in range(3):
        t0 = time.process_time()
        each(run, data)
        took.append((time.process_time() - t0) / len(lines) * 1e6)
    out[name] = statistics.median(took)
print(json.dumps(out))
"""


def _round(tree: Path, events: int) -> dict[str, float]:
    """Each workload's median of three in a fresh process of ``tree``, CPU us per event."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(events)], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, type=Path,
                        help="another checkout of the project")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    ours: list[dict[str, float]] = []
    base: list[dict[str, float]] = []
    for turn in range(args.rounds):
        for tree, into in ((ROOT, ours), (args.baseline, base))[::1 if turn % 2 else -1]:
            into.append(_round(tree, args.events))
    print(f"{args.events:,} events, {args.rounds} rounds (us/event, CPU; this tree's rate / the "
          "baseline's, same round)")
    for name in ours[0]:
        mine, theirs = [r[name] for r in ours], [r[name] for r in base]
        ratios = [b / o for o, b in zip(mine, theirs, strict=True)]
        rounds = ", ".join(f"{r:.0%}" for r in ratios)
        print(f"{name}: this tree {statistics.median(mine):.3f}, baseline "
              f"{statistics.median(theirs):.3f}; median {statistics.median(ratios):.0%} "
              f"(rounds {rounds})")


if __name__ == "__main__":
    main()
