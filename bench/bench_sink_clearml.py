"""ClearML sink: values/s it writes into offline sessions, against ClearML's own logging loop on
the same data, in the same process, alternating round by round.

Contenders (each round writes STEPS steps of VALUES metrics plus the epoch, as the Trainer logs
them: rank 0, stage "train"; each round into a fresh offline task of one cache directory):

* the ClearML sink: ``ClearmlSink.write`` of relay events in batches of 512, as the relay's sink
  process calls it (skip check, mapping to ClearMLCallback's titles, one ``ScalarEvent`` per
  value, ``metrics.jsonl`` appended and the state file saved once per batch); it counts the
  values it wrote, the epoch included;
* ``Logger.report_scalar`` per value plus ``report_single_value("epoch")`` per step: the loop of
  transformers' ``ClearMLCallback.on_log``; ClearML's reporter thread writes the lines, and the
  round ends when they are all in ``metrics.jsonl`` (``flush(wait=True)`` can return earlier);
  the baseline;
* ``Metrics.write_events`` of ``ScalarEvent`` objects, 4,096 per call, synchronous: ClearML's own
  writer at its fastest, what the sink calls underneath.

    python -m bench.bench_sink_clearml [--quick]
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
from sinks.clearml import SUMMARY_ITER, SUMMARY_TITLE, ClearmlSink

SINK = "ClearML sink (ClearmlSink.write)"
LOGGER = "Logger.report_scalar per value (HF on_log)"
WRITE_EVENTS = "Metrics.write_events, 4,096 per call"
BATCH = 512
MARK = b'"training_stats_scalar"'  # one per point in metrics.jsonl


def _events(run: str, values: int, steps: int) -> list[dict[str, Any]]:
    return [{"v": SCHEMA_VERSION, "run": run, "rank": 0, "local_rank": 0, "world_size": 1, "host": "bench",
             "seq": step, "ts": time.time(), "type": "metrics", "step": step, "epoch": step / 1000, "stage": "train",
             "data": {f"m{i}": 1.0 / (step + i + 1) for i in range(values)}} for step in range(steps)]


def _wait_written(path: Path, expected: int) -> None:
    """Until ``expected`` points are in the file: the reporter thread writes them after the loop."""
    while not path.exists() or path.read_bytes().count(MARK) < expected:
        time.sleep(0.005)


def run(quick: bool = False) -> Section:
    values, steps, rounds = (8, 200, 2) if quick else (8, 2_000, 7)
    section = Section("sink_clearml", "ClearML sink: values/s into offline sessions")
    tmp = Path(tempfile.mkdtemp(prefix="bench-clearml-"))
    saved_env = {k: os.environ.get(k) for k in ("CLEARML_CACHE_DIR", "CLEARML_OFFLINE_MODE")}
    sink = ClearmlSink(clearml_project="bench", clearml_dir=str(tmp))
    sink.open(SinkContext())  # sets ClearML offline, its cache directory to tmp
    from clearml import Task
    from clearml.backend_interface.metrics.events import ScalarEvent

    counter = iter(range(1_000_000))

    def new_task() -> Any:
        return Task(private=Task._Task__create_protection, project_name="bench", task_name=f"t{next(counter)}",
                    task_type=Task.TaskTypes.training)

    try:
        def with_sink() -> float:
            events = _events(f"bench-{next(counter)}", values, steps)
            sink.write(events[:1])  # creates the run's task: not timed
            written = sink.counters["values"]
            t0 = time.perf_counter()
            for i in range(1, len(events), BATCH):
                sink.write(events[i:i + BATCH])
            return (sink.counters["values"] - written) / (time.perf_counter() - t0)

        def logger_loop() -> float:
            task = new_task()
            logger = task.get_logger()
            path = Path(task.get_offline_mode_folder()) / "metrics.jsonl"
            t0 = time.perf_counter()
            for step in range(steps):
                for i in range(values):
                    logger.report_scalar("train", f"m{i}", 1.0 / (step + i + 1), iteration=step)
                logger.report_single_value("epoch", step / 1000)
            logger.flush(wait=True)
            _wait_written(path, steps * (values + 1))
            rate = steps * (values + 1) / (time.perf_counter() - t0)
            task.close()
            return rate

        def write_events() -> float:
            task = new_task()
            metrics = task._get_metrics_manager(task.get_output_destination())
            t0 = time.perf_counter()
            pending = []
            for step in range(steps):
                pending += [ScalarEvent(metric="train", variant=f"m{i}", value=1.0 / (step + i + 1), iter=step)
                            for i in range(values)]
                pending.append(ScalarEvent(metric=SUMMARY_TITLE, variant="epoch", value=step / 1000,
                                           iter=SUMMARY_ITER))
                if len(pending) >= 4096:
                    metrics.write_events(pending, async_enable=False)
                    pending = []
            metrics.write_events(pending, async_enable=False)
            rate = steps * (values + 1) / (time.perf_counter() - t0)
            task.close()
            return rate

        contenders: dict[str, Callable[[], float]] = {SINK: with_sink, LOGGER: logger_loop, WRITE_EVENTS: write_events}
        samples = alternate(contenders, rounds, "values/s")
    finally:
        sink.close()
        shutil.rmtree(tmp, ignore_errors=True)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    base = samples[LOGGER]
    rows = [base.row(), samples[WRITE_EVENTS].row(base), samples[SINK].row(base)]
    section.tables.append((f"{steps:,} steps x {values} values + epoch per round, one offline task per round", rows))
    sink_rate, raw = samples[SINK].median, samples[WRITE_EVENTS].median
    section.target("issue 11: ClearML sink >= 90% of ClearML's own Logger loop", sink_rate / base.median, 0.9, True,
                   f"{sink_rate / base.median:.0%} ({sink_rate:,.0f} vs {base.median:,.0f} values/s)")
    section.notes.append(f"Against ClearML's synchronous writer alone (no relay mapping): {sink_rate / raw:.0%}.")
    section.notes.append(f"{rounds} rounds per contender, alternating; each round in a fresh task.")
    return section


def main(argv: list[str] | None = None) -> Section:
    return cli(run, __doc__, argv)


if __name__ == "__main__":
    main()
