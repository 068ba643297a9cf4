"""A tracker sink's CPU per event, this tree against another checkout of the project (``git archive
<commit> | tar -x -C /tmp/before``), as bench/ingest_vs.py does for ingest: each round runs the
TensorBoard sink (bench/bench_sink_tensorboard.py's events: rank 0, 8 values a step) through
``write`` of 512-event batches, a ``flush`` after each, as the sink's process drives it, and
``close``, three times in a fresh process of each tree, in turn, who goes first alternating; the
process's CPU seconds, not the wall clock.

    python -m bench.sink_vs --baseline DIR [--events N] [--rounds R]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT

#: Run in the tree under test: its own sink and base classes.
CHILD = """
import sys, tempfile, time
from bench.bench_sink_tensorboard import BATCH, _events
from sinks.base import SinkContext
from sinks.tensorboard import TensorBoardSink
events = _events("bench-vs", 8, int(sys.argv[1]))
for _ in range(3):
    with tempfile.TemporaryDirectory(prefix="bench-sink-vs-") as folder:
        sink = TensorBoardSink(logdir=folder)
        sink.open(SinkContext())
        t0 = time.process_time()
        for i in range(0, len(events), BATCH):
            sink.write(events[i:i + BATCH])
            sink.flush()
        sink.close()
        print((time.process_time() - t0) / len(events) * 1e6)
"""


def _round(tree: Path, events: int) -> float:
    """The median of three rounds in a fresh process of ``tree``, CPU microseconds per event."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(events)], cwd=tree, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(tree)), check=True)
    return statistics.median(float(line) for line in done.stdout.split())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout of the project")
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    here, there, ratios = [], [], []
    for n in range(args.rounds):
        trees = [(ROOT, here), (args.baseline, there)]
        for tree, out in trees if n % 2 == 0 else trees[::-1]:
            out.append(_round(tree, args.events))
        ratios.append(there[-1] / here[-1])
        print(f"round {n + 1}: this tree {here[-1]:.2f} us/event, baseline {there[-1]:.2f}, rate {ratios[-1]:.0%}",
              flush=True)
    print(f"this tree {statistics.median(here):.2f} us/event, baseline {statistics.median(there):.2f}; "
          f"this tree's rate / the baseline's, same round: median {statistics.median(ratios):.0%}")


if __name__ == "__main__":
    main()
