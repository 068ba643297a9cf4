"""The viewers before and after a change, on the same big journal, alternating round by round:
``relay tail -n 20``, ``relay tail --view steps -n 20`` and ``relay plot`` (three metrics, a point per
line) run from another checkout (BEFORE, e.g. a ``git worktree`` of an older commit) and from this one;
wall time, CPU time and peak RSS as bench/bench_viewers.py measures them.

    git worktree add --detach /tmp/before e5a0d30
    python -m bench.viewers_before_after /tmp/before [--rounds 2] [--steps 250000]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_viewers import PLOT, command
from bench.common import ROOT, Sample, alternate_many, table
from tests.watch_helpers import training_journal


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="the checkout to compare this one with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=250_000, help="logged steps of the two-rank journal (4 lines each)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="viewers-before-after-") as tmp:
        big = Path(tmp) / "big.jsonl"
        training_journal(big, "big", args.steps, t0=time.time() - args.steps * 0.5 - 1, straggler_every=1000)
        cases = {"relay tail -n 20 FILE": ["tail", "-n", "20", str(big)],
                 "relay tail --view steps -n 20 FILE": ["tail", "--view", "steps", "-n", "20", str(big)],
                 "relay plot FILE (3 metrics)": ["plot", str(big), *PLOT, "-o", str(Path(tmp) / "p.png")]}
        trees = {"before": args.before.resolve(), "after": ROOT}
        print(f"load {os.getloadavg()[0]:.1f} at {time.strftime('%H:%M UTC', time.gmtime())}", flush=True)
        got = alternate_many({f"{case}, {when}": (lambda a=a, t=t: command([sys.executable, "-m", "relay", *a], tree=t))
                              for case, a in cases.items() for when, t in trees.items()}, args.rounds)
    for unit, title in (("s", "wall time"), ("cpu s", "CPU time (user + system)"), ("MiB", "peak RSS")):
        rows = []
        for case in cases:
            before, after = (Sample(f"{case}, {when}", "MiB" if unit == "MiB" else "s", got[f"{case}, {when}"][unit].values)
                             for when in trees)
            rows += [before.row(), after.row(before)]
        print(table(rows, title) + "\n")
    print(f"load {os.getloadavg()[0]:.1f} at {time.strftime('%H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main()
