"""Start-up: how soon the relay listens with all five tracker sinks against none, and what that costs
a demo job whose embedded relay has them (issue 16, item 4).

Contenders alternate round by round in one run, so drift hits both alike:

* **ready time**: ``relay`` on a fresh journal, from starting the process to its ready file (it then
  listens and acknowledges); with the five sinks also the time until every sink's process says its
  sink is open (the relay's stats file, written every 0.2 s), which now happens after ready, beside it.
* **job wall time**: the demo fine-tune on two CPU ranks (torchrun) with ``--tracker jsonl`` against
  ``--tracker jsonl,aim,mlflow,tensorboard,wandb,clearml``: the whole process, including the embedded
  relay's start and its stop (the sinks draining what they got).

    python -m bench.bench_startup [--quick]
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_training import demo_job
from bench.common import Sample, Section, alternate_many, cli, free_port, kill_group, spawn
from trainer.tracker_flags import TrackingArguments, sink_args

NONE, FIVE = "journal only", "journal + 5 tracker sinks"
TRACKERS = ("aim", "mlflow", "tensorboard", "wandb", "clearml")


def five_sinks(folder: Path) -> list[str]:
    """The five tracker sinks as the trainer's embedded relay gets them, writing into ``folder``."""
    return sink_args(list(TRACKERS), TrackingArguments(), str(folder))


def start_relay(folder: Path, five: bool, timeout: float = 300) -> dict[str, float]:
    """Seconds from starting a relay to its ready file, and (with the sinks) to every sink open."""
    folder.mkdir(parents=True)
    ready, journal = folder / "ready.json", folder / "logs"
    cmd = [sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}", "--ready-file", str(ready),
           "--path", f"{journal}/", "--stats-interval", "0.2", "--log-level", "warning",
           *(five_sinks(folder) if five else [])]
    with open(folder / "relay.log", "ab") as log:
        started = time.perf_counter()
        proc = spawn(cmd, stderr=log)
    out: dict[str, float] = {}
    try:
        deadline = started + timeout
        while not ready.exists():
            _alive(proc, folder, deadline)
            time.sleep(0.005)
        out["s to ready"] = time.perf_counter() - started
        while five and not _all_open(journal / "_relay_stats.json"):
            _alive(proc, folder, deadline)
            time.sleep(0.05)
        if five:
            out["s to every sink open"] = time.perf_counter() - started
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    finally:
        kill_group(proc)
    return out


def _all_open(stats: Path) -> bool:
    try:
        sinks = json.loads(stats.read_text())["sinks"]
    except (FileNotFoundError, ValueError, KeyError):
        return False
    return all(sinks.get(name, {}).get("open") for name in TRACKERS)


def _alive(proc: subprocess.Popen, folder: Path, deadline: float) -> None:
    if proc.poll() is not None or time.perf_counter() > deadline:
        raise RuntimeError(f"relay exited {proc.returncode} or timed out: "
                           f"{(folder / 'relay.log').read_text(errors='replace')[-1500:]}")


def run(quick: bool) -> Section:
    rounds, job_rounds, steps = (1, 1, 3) if quick else (5, 3, 30)
    section = Section("startup", "Start-up: ready time and demo job wall time, five tracker sinks against none")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        ready = alternate_many({name: (lambda five=five: start_relay(work / f"relay-{time.monotonic_ns()}", five))
                                for name, five in ((NONE, False), (FIVE, True))}, rounds)
        trackers = {NONE: "jsonl", FIVE: ",".join(("jsonl", *TRACKERS))}

        def job(name: str) -> dict[str, float]:
            out = work / f"job-{time.monotonic_ns()}"
            runtime, wall = demo_job(["-m", "trainer", "--tracker", trackers[name]], steps, out)
            return {"s job wall": wall, "s train_runtime": runtime}

        jobs = alternate_many({name: (lambda name=name: job(name)) for name in (NONE, FIVE)}, job_rounds)
    none_ready, five_ready = (Sample(f"{n}: to ready", "s", ready[n]["s to ready"].values) for n in (NONE, FIVE))
    all_open = Sample(f"{FIVE}: to every sink open (after ready)", "s", ready[FIVE]["s to every sink open"].values)
    section.add_table(f"relay start on a fresh journal, {rounds} rounds", [
        none_ready.row(), five_ready.row(none_ready), all_open.row(none_ready)])
    walls = {n: Sample(f"{n}: job wall", "s", jobs[n]["s job wall"].values) for n in (NONE, FIVE)}
    runtimes = {n: Sample(f"{n}: train_runtime", "s", jobs[n]["s train_runtime"].values) for n in (NONE, FIVE)}
    section.add_table(f"demo job (torchrun, 2 CPU ranks, {steps} steps, embedded relay), {job_rounds} rounds", [
        walls[NONE].row(), walls[FIVE].row(walls[NONE]), runtimes[NONE].row(), runtimes[FIVE].row(runtimes[NONE])])
    ratio = five_ready.median / none_ready.median
    section.target("ready with five sinks within 1.5x of none", ratio, 1.5, False, f"{ratio:.2f}x")
    job_ratio = walls[FIVE].median / walls[NONE].median
    section.target("demo job wall with five sinks within 1.5x of none", job_ratio, 1.5, False, f"{job_ratio:.2f}x")
    section.notes.append("The relay checks every sink before it binds (package found, paths writable, options) and "
                         "then listens; the sinks' processes import their libraries and open beside it. What "
                         "arrives meanwhile waits in their queues, and what did not fit is read back from the "
                         "journal (relay/sinkhost/catch_up.py).")
    section.data = {"ready": {n: {k: s.values for k, s in m.items()} for n, m in ready.items()},
                    "jobs": {n: {k: s.values for k, s in m.items()} for n, m in jobs.items()}}
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
