"""TensorBoard sink: values/s it writes into event files, against TensorBoard's own writing loops
on the same data, in the same process, alternating round by round.

Contenders (each round writes STEPS steps of VALUES metrics plus the epoch, as the Trainer logs
them: rank 0, stage "train"; every contender writes into its own fresh log directory):

* the TensorBoard sink: ``TensorBoardSink.write`` of relay events in batches of 512, as the
  relay's sink process calls it (skip check, mapping, one ``Event`` per step, records appended
  and the run's state file saved once per batch); it counts the values it wrote, epoch included;
* ``SummaryWriter.add_scalar`` per value, flushed once at the end of the round: the loop of
  transformers' ``TensorBoardCallback`` (torch's writer, which writes through tensorboard's
  ``EventFileWriter``) at its fastest; the baseline;
* the same, flushed after every step, as ``TensorBoardCallback.on_log`` really does;
* ``EventFileWriter`` with one ``Event`` per step holding all values: the tensorboard package's
  own writer, no torch, in the sink's own record layout.

    python -m bench.bench_sink_tensorboard [--quick]
"""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import Section, alternate, cli
from relay.wire.schema import SCHEMA_VERSION
from sinks.base import SinkContext
from sinks.tensorboard import TensorBoardSink

SINK = "TensorBoard sink (TensorBoardSink.write)"
ADD_SCALAR = "SummaryWriter.add_scalar per value"
HF_LOOP = "add_scalar per value, flush per step (HF on_log)"
PER_STEP = "EventFileWriter, one Event per step"
BATCH = 512


def _events(run: str, values: int, steps: int) -> list[dict[str, Any]]:
    return [{"v": SCHEMA_VERSION, "run": run, "rank": 0, "local_rank": 0, "world_size": 1, "host": "bench",
             "seq": step, "ts": time.time(), "type": "metrics", "step": step, "epoch": step / 1000, "stage": "train",
             "data": {f"m{i}": 1.0 / (step + i + 1) for i in range(values)}} for step in range(steps)]


def _logs(values: int, steps: int) -> list[dict[str, float]]:
    """The same numbers as a Trainer's ``on_log`` gets them, named as ``rewrite_logs`` names them."""
    return [{**{f"train/m{i}": 1.0 / (step + i + 1) for i in range(values)}, "train/epoch": step / 1000}
            for step in range(steps)]


def run(quick: bool = False) -> Section:
    values, steps, rounds = (8, 200, 2) if quick else (8, 2_000, 7)
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from torch.utils.tensorboard import (
        SummaryWriter,  # the writer HF's callback uses; not the sink's
    )

    section = Section("sink_tensorboard", "TensorBoard sink: values/s into event files")
    tmp = Path(tempfile.mkdtemp(prefix="bench-tb-"))
    logs = _logs(values, steps)
    counter = iter(range(1_000_000))

    def with_sink() -> float:
        folder = tmp / f"sink-{next(counter)}"
        sink = TensorBoardSink(logdir=str(folder))
        sink.open(SinkContext())
        events = _events("bench-tb", values, steps)
        t0 = time.perf_counter()
        for i in range(0, len(events), BATCH):
            sink.write(events[i:i + BATCH])
        sink.flush()
        took = time.perf_counter() - t0
        sink.close()
        return sink.counters["values"] / took

    def add_scalar(flush_each_step: bool) -> Callable[[], float]:
        def loop() -> float:
            writer = SummaryWriter(log_dir=str(tmp / f"torch-{next(counter)}"))
            t0 = time.perf_counter()
            for step, entry in enumerate(logs):
                for tag, value in entry.items():
                    writer.add_scalar(tag, value, step)
                if flush_each_step:
                    writer.flush()
            writer.flush()
            took = time.perf_counter() - t0
            writer.close()
            return steps * (values + 1) / took
        return loop

    def per_step() -> float:
        writer = EventFileWriter(str(tmp / f"efw-{next(counter)}"))
        t0 = time.perf_counter()
        for step, entry in enumerate(logs):
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)
                                                 for tag, value in entry.items()])
            writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
        writer.flush()
        took = time.perf_counter() - t0
        writer.close()
        return steps * (values + 1) / took

    contenders = {SINK: with_sink, ADD_SCALAR: add_scalar(False), HF_LOOP: add_scalar(True), PER_STEP: per_step}
    try:
        samples = alternate(contenders, rounds, "values/s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = samples[ADD_SCALAR]
    rows = [base.row(), samples[HF_LOOP].row(base), samples[PER_STEP].row(base), samples[SINK].row(base)]
    section.add_table(f"{steps:,} steps x {values} values + epoch per round, one run directory per round", rows)
    sink_rate = samples[SINK].median
    fastest = max(samples[ADD_SCALAR], samples[HF_LOOP], key=lambda s: s.median)  # the stricter baseline
    section.target("issue 11: TensorBoard sink >= 90% of SummaryWriter.add_scalar (HF's TensorBoardCallback loop, "
                   "the faster of its two forms)", sink_rate / fastest.median, 0.9, True,
                   f"{sink_rate / fastest.median:.0%} ({sink_rate:,.0f} vs {fastest.median:,.0f} values/s)")
    section.notes.append(f"Against tensorboard's own EventFileWriter with one Event per step (the sink's record "
                         f"layout, no mapping, no state file): {sink_rate / samples[PER_STEP].median:.0%}.")
    section.notes.append(f"{rounds} rounds per contender, alternating; each round opens a fresh directory (not timed).")
    return section


def main(argv: list[str] | None = None) -> Section:
    return cli(run, __doc__, argv)


if __name__ == "__main__":
    main()
