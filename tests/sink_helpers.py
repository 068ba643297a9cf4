"""Shared helpers for the sink tests: envelope events of a small training run, real rank processes
that publish them, a small filesystem to fill, and ``drive`` (a sink driven as its process drives
it). Reading each tracker back is tests/sink_readback.py."""
from __future__ import annotations

import gc
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import once_per_run
from relay.wire.schema import SCHEMA_VERSION
from sinks.events import attempt_base


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


def resumed_events(run: str, saved: int = 3, held: int = 5, steps: int = 6) -> list[dict[str, Any]]:
    """A run whose first attempt logged steps 1-``held`` after a checkpoint at ``saved`` and died, and whose
    second attempt (seqs from attempt_base(1), as a resumed job's publisher numbers them) resumed from the
    checkpoint and logged to ``steps``: loss 1/step in the first, 10/step in the second; the job's
    ``--run_name`` in the ``run`` params."""
    ev = Events(run, world_size=1)
    out = [ev(0, "hello", {"pid": 100, "attempt": 0}),
           ev(0, "params", {"run_id": run, "run_name": "named-job", "attempt": 0}, stage="run"),
           ev(0, "lifecycle", {"event": "train_begin", "attempt": 0, "resumed_from": None}, step=0)]
    out += [ev(0, "metrics", {"loss": 1 / s}, step=s, stage="train") for s in range(1, held + 1)]
    ev.seqs[0] = attempt_base(1)
    out += [ev(0, "hello", {"pid": 200, "attempt": 1}),
            ev(0, "params", {"run_id": run, "run_name": "named-job", "attempt": 1}, stage="run"),
            ev(0, "lifecycle", {"event": "train_begin", "attempt": 1, "resumed_from": saved}, step=saved)]
    out += [ev(0, "metrics", {"loss": 10 / s}, step=s, stage="train") for s in range(saved + 1, steps + 1)]
    return out + [ev(0, "lifecycle", {"event": "train_end", "status": "completed"}, step=steps)]


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


@pytest.fixture
def aim_repo(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tmp_path / "aim"``, holding an Aim repository as Aim's own set-up leaves it (``aim init``),
    copied from one set up once per test run: the set-up runs Aim's database migrations in a Python
    process of their own (over a CPU-second), which a test of what the sink writes into a repository
    need not pay again. Tests of the sink's own set-up of a new repository give it an empty folder."""
    with once_per_run(tmp_path_factory, "aim-template") as template:
        if not (template / "done").exists():
            from aim.sdk.repo import Repo

            shutil.rmtree(template, ignore_errors=True)
            template.mkdir()
            repo = Repo.from_path(str(template / "repo"), init=True)
            repo.structured_db.engine.dispose()
            del repo
            gc.collect()
            (template / "done").touch()
        shutil.copytree(template / "repo", tmp_path / "aim")
    return tmp_path / "aim"


@pytest.fixture
def small_fs(tmp_path: Path):
    """A real 24 MiB filesystem for a tracker's files, to fill up mid-run (needs mount rights)."""
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
                 output_dir: str | None, pause: float, gate: str | None = None) -> dict[str, Any]:
    """Stand-in for one training rank: publish its share of training_events() through a real
    Publisher, ``pause`` seconds apart per step, then flush. With ``gate`` (a path), the second
    half of the steps waits until that file exists: a test opens it when its fault is ready, so
    the fault comes mid-run however slow the machine is."""
    from relay.client.publisher import Publisher

    pub = Publisher(run, rank, world_size=2, address=address)
    for event in training_events(run, output_dir, steps, experiment):
        if event["rank"] != rank or event["type"] in ("hello", "stats"):  # the Publisher sends those
            continue
        if gate and (event["step"] or 0) > steps // 2:
            wait_file(Path(gate))
            gate = None
        pub.publish(event["type"], event["data"], step=event["step"], epoch=event["epoch"], stage=event["stage"])
        if event["stage"] == "rank" and pause:
            time.sleep(pause)
    left = pub.close(60.0)
    return {**pub.stats, "left": left}


def wait_file(path: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} not there within {timeout} s")
        time.sleep(0.02)


def start_rank(address: str, run: str, rank: int, steps: int, *, experiment: str | None = None,
               output_dir: Path | None = None, pause: float = 0.0, gate: Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.Popen:
    """``publish_rank`` in a process of its own (a real rank: its own Publisher and sockets)."""
    cmd = [sys.executable, __file__, address, run, str(rank), str(steps), experiment or "-",
           str(output_dir) if output_dir else "-", str(pause), str(gate) if gate else "-"]
    return subprocess.Popen(cmd, cwd=Path(__file__).resolve().parent.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


if __name__ == "__main__":
    # python tests/sink_helpers.py ADDRESS RUN RANK STEPS EXPERIMENT|- OUTPUT_DIR|- PAUSE [GATE|-]
    addr, run_id, rank_s, steps_s, exp, out_dir, pause_s, gate_path = (sys.argv[1:9] + ["-"])[:8]
    result = publish_rank(addr, run_id, int(rank_s), int(steps_s), None if exp == "-" else exp,
                          None if out_dir == "-" else out_dir, float(pause_s), None if gate_path == "-" else gate_path)
    print(__import__("json").dumps(result))


def finish_ranks(procs: list[subprocess.Popen], timeout: float = 300) -> None:
    """Every rank process of ``publish_rank`` done, and each said its events were all acknowledged."""
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1])["left"] == 0


def drive(sink: Any, batches: list[list[dict[str, Any]]], journal: Path | None = None, *,
          deadletters: Path | None = None, fault: Any = None) -> Any:
    """Open ``sink`` as a sink process would and drive it as the process does (relay/sinkhost/driver.py):
    ``batches`` written, refusals dead-lettered (to ``deadletters``), flushed (with a ``journal``, each
    flush after what it holds of the runs the sink names in ``holes()``: relay/sinkhost/catch_up.py),
    closed. A transient failure fails the test (none is retried here).
    Returns the sink, for its counters."""
    from relay.journal.deadletter import DeadLetters
    from relay.sinkhost.catch_up import CatchUp
    from relay.sinkhost.driver import SinkDriver
    from sinks.base import SinkContext

    sink.open(SinkContext(journal=journal))
    driver = SinkDriver(sink.name, sink, DeadLetters(deadletters) if deadletters else None,
                        wait=lambda seconds: seconds <= 0, fault=fault)
    read = CatchUp(str(journal), sink.name).run_batches if journal else None
    try:
        for batch in batches:
            assert driver.write(batch), f"sink {sink.name} failed: {driver.last_error}"
            driver.after_batch(idle=False, read=read)
        assert read is None or driver.fill_holes(read), f"sink {sink.name} failed: {driver.last_error}"
        assert driver.flush(), f"sink {sink.name} failed to flush: {driver.last_error}"
    finally:
        driver.close()
    return sink
