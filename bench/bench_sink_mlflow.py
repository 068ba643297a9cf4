"""MLflow sink: values/s it writes into an MLflow run (SQLite store), against MLflow's own logging
loops on the same data, into the same run, in the same process, alternating round by round.

Contenders (each round writes STEPS steps of VALUES metrics plus the epoch, as the Trainer logs
them: rank 0, stage "train"; each under its own metric names, all in the sink's own MLflow run, so
all pay for the same database and the same growing tables):

* the MLflow sink: ``MlflowSink.write`` of relay events in batches of 512, as the relay's sink
  process calls it (skip check, mapping, ``log_batch`` calls of up to 1,000 points, the applied
  spans saved as run tags once per batch); it counts the values it wrote, epoch included;
* ``mlflow.log_metrics(..., synchronous=False)`` per step, drained at the end of the round: the
  loop of transformers' ``MLflowCallback.on_log`` (MLflow >= 2.8); the baseline;
* ``mlflow.log_metrics`` per step, synchronous: MLflow's default, and HF's loop before 2.8;
* ``MlflowClient.log_batch`` of 1,000 points: MLflow's fastest public form, no mapping at all.

    python -m bench.bench_sink_mlflow [--quick]
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import Section, alternate, cli
from relay.wire.schema import SCHEMA_VERSION
from sinks.base import SinkContext
from sinks.mlflow import MlflowSink

SINK = "MLflow sink (MlflowSink.write)"
HF_LOOP = "mlflow.log_metrics per step, async (HF on_log)"
SYNC = "mlflow.log_metrics per step, synchronous"
BATCHED = "MlflowClient.log_batch, 1,000 per call"
RUN_ID = "bench-mlflow"
BATCH = 512


class _Feed:
    """Consecutive steps for each contender, so no round writes another's points again."""

    def __init__(self, values: int, steps: int) -> None:
        self.values, self.steps = values, steps
        self.next_step: dict[str, int] = {}
        self.seq = 0

    def steps_for(self, who: str, steps: int | None = None) -> range:
        start = self.next_step.get(who, 0)
        self.next_step[who] = start + (steps or self.steps)
        return range(start, start + (steps or self.steps))

    def logs(self, who: str, steps: int | None = None) -> list[tuple[int, dict[str, float]]]:
        """(step, {name: value}) as a Trainer's ``on_log`` gets them, epoch included."""
        return [(step, {**{f"{who}_m{i}": 1.0 / (step + i + 1) for i in range(self.values)},
                        f"{who}_epoch": step / 1000}) for step in self.steps_for(who, steps)]

    def events(self) -> list[dict[str, Any]]:
        out = []
        for step in self.steps_for("sink"):
            out.append({"v": SCHEMA_VERSION, "run": RUN_ID, "rank": 0, "local_rank": 0, "world_size": 1,
                        "host": "bench", "seq": self.seq, "ts": time.time(), "type": "metrics", "step": step,
                        "epoch": step / 1000, "stage": "train",
                        "data": {f"sink_m{i}": 1.0 / (step + i + 1) for i in range(self.values)}})
            self.seq += 1
        return out


def run(quick: bool = False) -> Section:
    # --quick: 50 steps (5 synchronous), enough to run every contender: its CPU was the loops (200 steps: some
    # 5 of the section's 9 CPU-s) beside MLflow's import and its SQLite store's set-up.
    values, steps, rounds = (8, 50, 2) if quick else (8, 2_000, 7)
    sync_steps = steps // 10  # one database transaction per step: ten times fewer, for the same time
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow
    from mlflow.entities import Metric

    section = Section("sink_mlflow", "MLflow sink: values/s into one MLflow run (SQLite)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-mlflow-"))
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    sink = MlflowSink(uri, "bench")
    sink.open(SinkContext())
    feed = _Feed(values, steps)
    try:
        sink.write(feed.events())  # creates the run and its tables' first rows: not timed
        run_id = sink._ml[RUN_ID].run_id  # the sink's own run: every contender writes into it
        mlflow.set_tracking_uri(uri)
        mlflow.start_run(run_id=run_id)
        client = mlflow.MlflowClient(uri)

        def with_sink() -> float:
            events = feed.events()
            written = sink.counters["values"]
            t0 = time.perf_counter()
            for i in range(0, len(events), BATCH):
                sink.write(events[i:i + BATCH])
            return (sink.counters["values"] - written) / (time.perf_counter() - t0)

        def log_metrics(synchronous: bool) -> Callable[[], float]:
            def loop() -> float:
                logs = feed.logs("sync" if synchronous else "hf", None if not synchronous else sync_steps)
                t0 = time.perf_counter()
                for step, metrics in logs:
                    mlflow.log_metrics(metrics, step=step, synchronous=synchronous)
                mlflow.flush_async_logging()
                return len(logs) * (values + 1) / (time.perf_counter() - t0)
            return loop

        def batched() -> float:
            logs = feed.logs("batch")
            t0 = time.perf_counter()
            ms = int(time.time() * 1000)
            points = [Metric(name, value, ms, step) for step, metrics in logs for name, value in metrics.items()]
            for i in range(0, len(points), 1000):
                client.log_batch(run_id, metrics=points[i:i + 1000])
            return len(points) / (time.perf_counter() - t0)

        contenders = {SINK: with_sink, HF_LOOP: log_metrics(False), SYNC: log_metrics(True), BATCHED: batched}
        samples = alternate(contenders, rounds, "values/s")
    finally:
        if mlflow.active_run() is not None:
            mlflow.end_run()
        sink.close()
        shutil.rmtree(tmp, ignore_errors=True)
    base = samples[HF_LOOP]
    rows = [base.row(), samples[SYNC].row(base), samples[BATCHED].row(base), samples[SINK].row(base)]
    section.add_table(f"{steps:,} steps x {values} values + epoch per round ({sync_steps:,} for the synchronous "
                      "loop), one MLflow run, SQLite store", rows)
    sink_rate = samples[SINK].median
    section.target("issue 11: MLflow sink >= 90% of mlflow.log_metrics (HF's MLflowCallback loop)",
                   sink_rate / base.median, 0.9, True,
                   f"{sink_rate / base.median:.0%} ({sink_rate:,.0f} vs {base.median:,.0f} values/s)")
    section.notes.append(f"Against MLflow's fastest public form (log_batch of 1,000 points, no mapping, no span "
                         f"tags): {sink_rate / samples[BATCHED].median:.0%}.")
    section.notes.append(f"{rounds} rounds per contender, alternating, after one untimed round that creates the run.")
    return section


def main(argv: list[str] | None = None) -> Section:
    return cli(run, __doc__, argv)


if __name__ == "__main__":
    main()
