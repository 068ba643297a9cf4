"""Shared helpers for the Aim sink tests: build envelope events and read an Aim repo back through
Aim's own API (no private state of the sink)."""
from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from relay.wire.schema import SCHEMA_VERSION


class Events:
    """Events of one training run, with per-rank seqs numbered as the publisher does."""

    def __init__(self, run: str, world_size: int = 2, host: str = "node0") -> None:
        self.run = run
        self.world_size = world_size
        self.host = host
        self.seqs: dict[int, int] = {}

    def __call__(self, rank: int, type_: str, data: dict[str, Any], *, step: int | None = None,
                 epoch: float | None = None, stage: str | None = None) -> dict[str, Any]:
        seq = self.seqs.get(rank, 0)
        self.seqs[rank] = seq + 1
        return {"v": SCHEMA_VERSION, "run": self.run, "rank": rank, "local_rank": rank,
                "world_size": self.world_size, "host": self.host, "seq": seq, "ts": time.time(),
                "type": type_, "step": step, "epoch": epoch, "stage": stage, "data": data}


def training_events(run: str, output_dir: str | None = None, steps: int = 6, experiment: str | None = None,
                    end: bool = True) -> list[dict[str, Any]]:
    """What the trainer's callback publishes for a small two-rank run, in a plausible order."""
    ev = Events(run)
    out = [ev(0, "hello", {"pid": 100}), ev(1, "hello", {"pid": 101})]
    out.append(ev(0, "lifecycle", {"event": "train_begin", "max_steps": steps}, step=0, epoch=0.0))
    hparams: dict[str, Any] = {"learning_rate": 2e-5, "max_grad_norm": math.inf, "seed": 42}
    if output_dir is not None:
        hparams["output_dir"] = output_dir
    out.append(ev(0, "params", hparams, stage="hparams"))
    out.append(ev(0, "params", {"model_type": "llama", "hidden_size": 64}, stage="model"))
    out.append(ev(0, "params", {"dataset": "v3", "owner": "team-a"}, stage="experiment_metadata"))
    if experiment is not None:
        out.append(ev(0, "params", {"experiment": experiment}, stage="run"))
    out.append(ev(0, "metrics", {"model_load_time": 3.25}, stage="additional_metrics"))
    for step in range(1, steps + 1):
        epoch = step / steps
        loss = math.nan if step == 3 else 2.0 / step
        out.append(ev(0, "metrics", {"loss": loss, "grad_norm": 1.5, "learning_rate": 1e-5 * step},
                      step=step, epoch=epoch, stage="train"))
        for rank in (0, 1):
            out.append(ev(rank, "metrics", {"step_time": 0.1 * (rank + 1) + step / 1000, "steps": 1},
                          step=step, epoch=epoch, stage="rank"))
        if step % 3 == 0:
            out.append(ev(0, "metrics", {"loss": 1.0 / step, "runtime": 0.5}, step=step, epoch=epoch, stage="eval"))
            out.append(ev(0, "lifecycle", {"event": "checkpoint", "path": f"ckpt-{step}"}, step=step, epoch=epoch))
    out.append(ev(0, "metrics", {"train_loss": 0.9, "train_runtime": 12.0, "total_flos": 1e9},
                  step=steps, epoch=1.0, stage="train"))
    if end:
        out.append(ev(0, "lifecycle", {"event": "train_end", "status": "completed"}, step=steps, epoch=1.0))
    out.append(ev(0, "stats", {"dropped": 0, "published": ev.seqs[0] + 1}, stage="client"))
    out.append(ev(1, "stats", {"dropped": 0, "published": ev.seqs[1] + 1}, stage="client"))
    return out


@dataclass
class AimRunView:
    """An Aim run as a plain value: params, experiment, Aim's own times (``creation_time``,
    ``end_time``, ``duration``) and every metric as {step: value}."""

    hash: str
    name: str
    experiment: str
    active: bool
    params: dict[str, Any]
    creation_time: float
    end_time: float | None
    duration: float
    metrics: dict[tuple[str, tuple], dict[int, float]] = field(default_factory=dict)
    timestamps: dict[tuple[str, tuple], list[float]] = field(default_factory=dict)

    def series(self, name: str, **context: Any) -> dict[int, float]:
        return self.metrics[(name, tuple(sorted(context.items())))]


def read_repo(path: str) -> dict[str, AimRunView]:
    """Every run of the repo at ``path``, by its relay run id, read the way the issue asks:
    ``Repo.list_all_runs()`` and ``Run(hash, read_only=True)``."""
    from aim import Repo, Run

    # Aim caches the directory listing for 0.5 s per repo path; a test reads right after writing.
    Repo._all_run_hashes.cache_clear()
    repo = Repo(path)
    runs: dict[str, AimRunView] = {}
    for run_hash in repo.list_all_runs():
        run = Run(run_hash, repo=repo, read_only=True)
        params = run.get(..., {}) or {}
        view = AimRunView(run_hash, run.name, run.experiment, run.active, params, run.creation_time, run.end_time,
                          run.duration)
        for name, context, _ in run.iter_metrics_info():
            metric = run.get_metric(name, context)
            steps, (values, _epochs, times) = metric.data.items_list()
            key = (name, tuple(sorted(context.to_dict().items())))
            assert len(set(steps)) == len(steps), f"{key}: repeated steps {steps}"
            view.metrics[key] = dict(zip(steps, values))
            view.timestamps[key] = list(times)
        run_id = params.get("relay", {}).get("run_id", run_hash)
        assert run_id not in runs, f"two Aim runs for run id {run_id}"
        runs[run_id] = view
    return runs


def same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def check_training_run(view, steps: int = 6) -> None:
    """The content every test expects from training_events(): one place, so replay compares alike."""
    loss = view.series("loss")
    assert sorted(loss) == list(range(1, steps + 1))
    assert math.isnan(loss[3]) and loss[2] == 1.0
    assert view.series("loss", subset="eval") == {s: 1 / s for s in range(3, steps + 1, 3)}
    assert view.series("loss", subset="train") == {steps: 0.9}
    assert view.series("runtime", subset="train") == {steps: 12.0}
    assert view.series("total_flos") == {steps: 1e9}
    assert sorted(view.series("epoch")) == list(range(1, steps + 1))
    for rank in (0, 1):
        step_time = view.series("__system__rank_step_time_s", rank=rank)  # the wire's step_time, named for display
        assert sorted(step_time) == list(range(1, steps + 1))
        assert step_time[2] == pytest.approx(0.1 * (rank + 1) + 0.002)
        assert set(view.series("__system__rank_steps_per_log", rank=rank).values()) == {1}
        assert view.params["relay"]["client"][f"rank{rank}"]["dropped"] == 0
    assert not [name for name, _ in view.metrics if name.startswith("relay_")], "no counter drawn while none dropped"
    assert list(view.series("model_load_time", subset="additional_metrics", rank=0).values()) == [3.25]
    assert view.params["hparams"]["learning_rate"] == 2e-5
    assert view.params["hparams"]["max_grad_norm"] == "Infinity"  # as the JSONL journal keeps it
    assert view.params["model"] == {"model_type": "llama", "hidden_size": 64}
    assert view.params["experiment_metadata"] == {"dataset": "v3", "owner": "team-a"}
    assert set(view.params["relay"]["ranks"]) == {"0", "1"}
    assert {k: c["path"] for k, c in view.params["relay"]["checkpoints"].items()} == {
        str(s): f"ckpt-{s}" for s in range(3, steps + 1, 3)}


@pytest.fixture
def small_fs(tmp_path: Path):
    """A real 24 MiB filesystem for the Aim repo, to fill up mid-run (needs mount rights)."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        gc.collect()  # Aim handles dropped after a failure close their files before the unmount
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> None:
    with open(path, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
        except OSError:
            pass


def publish_rank(address: str, run: str, rank: int, steps: int, experiment: str | None,
                 output_dir: str | None, pause: float) -> dict[str, Any]:
    """Stand-in for one training rank: publish its share of training_events() through a real
    Publisher, ``pause`` seconds apart per step, then flush."""
    from relay.client.publisher import Publisher

    pub = Publisher(run, rank, world_size=2, address=address)
    for event in training_events(run, output_dir, steps, experiment):
        if event["rank"] != rank or event["type"] in ("hello", "stats"):  # the Publisher sends those
            continue
        pub.publish(event["type"], event["data"], step=event["step"], epoch=event["epoch"], stage=event["stage"])
        if event["stage"] == "rank" and pause:
            time.sleep(pause)
    left = pub.close(60.0)
    return {**pub.stats, "left": left}


if __name__ == "__main__":
    # python tests/aim_helpers.py ADDRESS RUN RANK STEPS EXPERIMENT|- OUTPUT_DIR|- PAUSE
    addr, run_id, rank_s, steps_s, exp, out_dir, pause_s = sys.argv[1:8]
    result = publish_rank(addr, run_id, int(rank_s), int(steps_s), None if exp == "-" else exp,
                          None if out_dir == "-" else out_dir, float(pause_s))
    print(__import__("json").dumps(result))


def finish_ranks(procs: list[subprocess.Popen], timeout: float = 120) -> None:
    """Every rank process of ``publish_rank`` done, and each said its events were all acknowledged."""
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1])["left"] == 0


def drive(sink: Any, batches: list[list[dict[str, Any]]], journal: Path | None = None, *,
          deadletters: Path | None = None, fault: Any = None) -> Any:
    """Open ``sink`` as a sink process would (the journal's reader for catch-up) and drive it as the
    process does (relay/sinkhost/driver.py): ``batches`` written, refusals dead-lettered (to
    ``deadletters``), flushed, closed. A transient failure fails the test (none is retried here).
    Returns the sink, for its counters."""
    from relay.journal.deadletter import DeadLetters
    from relay.journal.reader import JournalReader
    from relay.sinkhost.driver import SinkDriver
    from sinks.base import SinkContext

    sink.open(SinkContext(journal=journal, journal_events=JournalReader(journal) if journal else None))
    driver = SinkDriver(sink.name, sink, DeadLetters(deadletters) if deadletters else None,
                        wait=lambda seconds: seconds <= 0, fault=fault)
    try:
        for batch in batches:
            assert driver.write(batch), f"sink {sink.name} failed: {driver.last_error}"
            driver.after_batch(idle=False)
        assert driver.flush(), f"sink {sink.name} failed to flush: {driver.last_error}"
    finally:
        driver.close()
    return sink
