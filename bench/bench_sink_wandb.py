"""W&B sink: values/s it writes into an offline W&B run, against W&B's own logging loop on the same
data, in the same process, alternating round by round.

Contenders (each round writes STEPS steps of VALUES metrics plus the epoch, as the Trainer logs
them: rank 0, stage "train"; each round writes a fresh offline run through the same wandb-core):

* the W&B sink: ``WandbSink.write`` of relay events in batches of 512, as the relay's sink process
  calls it (skip check, mapping to W&B's names, one ``run.log`` per event with its own
  ``train/global_step``, explicit ``_step`` and the event's time, the state file saved once per
  batch); it counts the values it logged, epoch included;
* ``run.log`` per step: the loop of transformers' ``WandbCallback.on_log``
  (``run.log({**rewrite_logs(logs), "train/global_step": step})``, after the same
  ``define_metric`` calls); the baseline.

Only the logging is timed: each round opens its W&B run before (the sink: with one untimed event)
and finishes it after, so wandb-core has written everything before the next contender starts.

    python -m bench.bench_sink_wandb [--quick]
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Section, alternate, cli
from relay.wire.schema import SCHEMA_VERSION
from sinks.base import SinkContext
from sinks.wandb import WandbSink
from sinks.wandb_layout import STEP_KEY

SINK = "W&B sink (WandbSink.write)"
HF_LOOP = "run.log per step (HF WandbCallback.on_log)"
BATCH = 512


def _events(run: str, values: int, steps: int) -> list[dict[str, Any]]:
    return [{"v": SCHEMA_VERSION, "run": run, "rank": 0, "local_rank": 0, "world_size": 1, "host": "bench",
             "seq": step, "ts": time.time(), "type": "metrics", "step": step, "epoch": step / 1000, "stage": "train",
             "data": {f"m{i}": 1.0 / (step + i + 1) for i in range(values)}} for step in range(steps + 1)]


def _logs(values: int, steps: int) -> list[dict[str, float]]:
    """The same numbers as a Trainer's ``on_log`` gets them, named as ``rewrite_logs`` names them."""
    return [{**{f"train/m{i}": 1.0 / (step + i + 1) for i in range(values)}, "train/epoch": step / 1000}
            for step in range(1, steps + 1)]


def run(quick: bool = False) -> Section:
    values, steps, rounds = (8, 200, 2) if quick else (8, 2_000, 7)
    os.environ.pop("WANDB_SERVICE", None)
    import wandb

    section = Section("sink_wandb", "W&B sink: values/s into an offline W&B run")
    tmp = Path(tempfile.mkdtemp(prefix="bench-wandb-"))
    logs = _logs(values, steps)
    counter = iter(range(1_000_000))
    settings = wandb.Settings(mode="offline", reinit="create_new", silent=True, console="off", x_disable_stats=True,
                              x_disable_meta=True, x_disable_machine_info=True, disable_code=True, disable_git=True,
                              save_code=False, x_save_requirements=False)

    def with_sink() -> float:
        sink = WandbSink(wandb_project="bench", wandb_dir=str(tmp))
        sink.open(SinkContext())
        events = _events(f"sink-{next(counter)}", values, steps)
        sink.write(events[:1])  # opens the W&B run: not timed
        before = sink.counters["values"]
        t0 = time.perf_counter()
        for i in range(1, len(events), BATCH):
            sink.write(events[i:i + BATCH])
        took = time.perf_counter() - t0
        sink.close()
        return (sink.counters["values"] - before) / took

    def hf_loop() -> float:
        run = wandb.init(project="bench", id=f"own-{next(counter)}", dir=str(tmp), settings=settings)
        run.define_metric(STEP_KEY)
        run.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        t0 = time.perf_counter()
        for step, entry in enumerate(logs, 1):
            run.log({**entry, STEP_KEY: step})
        took = time.perf_counter() - t0
        run.finish()
        return steps * (values + 1) / took

    try:
        samples = alternate({SINK: with_sink, HF_LOOP: hf_loop}, rounds, "values/s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = samples[HF_LOOP]
    section.add_table(f"{steps:,} steps x {values} values + epoch per round, one offline W&B run per round",
                      [base.row(), samples[SINK].row(base)])
    sink_rate = samples[SINK].median
    section.target("issue 11: W&B sink >= 90% of run.log per step (HF's WandbCallback loop)",
                   sink_rate / base.median, 0.9, True,
                   f"{sink_rate / base.median:.0%} ({sink_rate:,.0f} vs {base.median:,.0f} values/s)")
    section.notes.append(f"{rounds} rounds per contender, alternating; opening and finishing each W&B run is "
                         "not timed (wandb-core writes the .wandb file in the background, for both alike).")
    return section


def main(argv: list[str] | None = None) -> Section:
    return cli(run, __doc__, argv)


if __name__ == "__main__":
    main()
