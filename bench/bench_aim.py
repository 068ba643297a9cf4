"""Aim sink: values/s it writes into an Aim run, against Aim's own ``Run.track`` loops writing
into the same run, in the same process, alternating round by round.

Contenders (each round writes STEPS steps of VALUES metrics, all rank 0, stage "train"):

* the Aim sink: ``AimSink.write`` of relay events in batches of 512, as the relay's sink
  thread calls it (skip check, mapping, one ``_track`` per event and context, spans saved
  once per batch); it counts the values it tracked, which include the ``epoch`` series;
* ``Run.track`` per value: the loop Aim's own Hugging Face callback runs (``for name, value in
  logs.items(): run.track(value, name=..., step=..., epoch=..., context=...)``);
* ``Run.track`` per dict: one call per step with all values, Aim's fastest public form.

Each contender writes its own metric names in the sink's own Aim run, so all three pay for the
same RocksDB, the same run and the same growing sequences.

    python -m bench.bench_aim [--quick]
"""
from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import Section, alternate, table
from relay.wire.schema import SCHEMA_VERSION
from sinks.aim import AimSink
from sinks.base import SinkContext

SINK, PER_VALUE, PER_DICT = "Aim sink (AimSink.write)", "Run.track per value", "Run.track per dict"
RUN_ID = "bench-aim"
BATCH = 512


class _Feed:
    """Consecutive steps for each contender, so no round overwrites another's points."""

    def __init__(self, values: int, steps: int) -> None:
        self.values, self.steps = values, steps
        self.next_step: dict[str, int] = {}
        self.seq = 0

    def steps_for(self, who: str) -> range:
        start = self.next_step.get(who, 0)
        self.next_step[who] = start + self.steps
        return range(start, start + self.steps)

    def events(self, names: list[str]) -> list[dict[str, Any]]:
        out = []
        for step in self.steps_for("sink"):
            out.append({"v": SCHEMA_VERSION, "run": RUN_ID, "rank": 0, "local_rank": 0, "world_size": 1,
                        "host": "bench", "seq": self.seq, "ts": time.time(), "type": "metrics", "step": step,
                        "epoch": step / 1000, "stage": "train",
                        "data": {name: 1.0 / (step + i + 1) for i, name in enumerate(names)}})
            self.seq += 1
        return out


def run(quick: bool = False) -> Section:
    values, steps, rounds = (8, 200, 2) if quick else (8, 2_000, 7)
    section = Section("aim", "Aim sink: values/s into one Aim run")
    tmp = tempfile.mkdtemp(prefix="bench-aim-")
    # Registered before Aim registers its own exit cleanup, so it runs after it (atexit is LIFO):
    # Aim flushes its repo containers at exit and needs the directory still there.
    atexit.register(shutil.rmtree, tmp, True)
    sink = AimSink(repo=str(Path(tmp) / "aim"))
    sink.open(SinkContext())
    feed = _Feed(values, steps)
    try:
        sink.write(feed.events([f"sink_m{i}" for i in range(values)]))  # creates the run: not timed
        aim_run = sink._aim[RUN_ID].handle  # the sink's own run: every contender writes into it

        def with_sink() -> float:
            events = feed.events([f"sink_m{i}" for i in range(values)])
            written = sink.counters["values"]
            t0 = time.perf_counter()
            for i in range(0, len(events), BATCH):
                sink.write(events[i:i + BATCH])
            # what it tracked: the values, plus "epoch" per step as Aim's own callback does
            return (sink.counters["values"] - written) / (time.perf_counter() - t0)

        def per_value() -> float:
            names = [f"value_m{i}" for i in range(values)]
            t0 = time.perf_counter()
            for step in feed.steps_for("value"):
                for i, name in enumerate(names):
                    aim_run.track(1.0 / (step + i + 1), name=name, step=step, epoch=step / 1000, context={})
            return steps * values / (time.perf_counter() - t0)

        def per_dict() -> float:
            names = [f"dict_m{i}" for i in range(values)]
            t0 = time.perf_counter()
            for step in feed.steps_for("dict"):
                aim_run.track({name: 1.0 / (step + i + 1) for i, name in enumerate(names)},
                              step=step, epoch=step / 1000, context={})
            return steps * values / (time.perf_counter() - t0)

        contenders: dict[str, Callable[[], float]] = {SINK: with_sink, PER_VALUE: per_value, PER_DICT: per_dict}
        samples = alternate(contenders, rounds, "values/s")
    finally:
        sink.close()
    base = samples[PER_VALUE]
    rows = [base.row(), samples[PER_DICT].row(base), samples[SINK].row(base)]
    section.tables.append((f"{steps:,} steps x {values} values per round, one Aim run, local repo", rows))
    sink_rate = samples[SINK].median
    section.target("issue 4: Aim sink >= 90% of Aim's own Run.track loop", sink_rate / base.median, 0.9, True,
                   f"{sink_rate / base.median:.0%} ({sink_rate:,.0f} vs {base.median:,.0f} values/s)")
    dict_rate = samples[PER_DICT].median
    section.notes.append(f"Against Aim's fastest public form (one dict per step): {sink_rate / dict_rate:.0%}.")
    section.notes.append(f"{rounds} rounds per contender, alternating, after one untimed round that opens the run.")
    return section


def main(argv: list[str] | None = None) -> Section:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    section = run(parser.parse_args(argv).quick)
    for title, rows in section.tables:
        print(table(rows, title) + "\n")
    for target in section.targets:
        print(f"- {target['target']}: {target['shown']} ({'met' if target['met'] else 'NOT met'})")
    for note in section.notes:
        print(f"- {note}")
    return section


if __name__ == "__main__":
    main()
