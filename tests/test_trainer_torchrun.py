"""Real two-rank jobs (CPU, gloo) on the demo model, with real relay processes on loopback: the job with an
external relay under the shared job's run name is real torchrun's ``-m trainer`` (the seed's command); the
shared job (``tracked_job``) and the job whose relay comes up mid-run run under torchrun's agent with warm
ranks (tests/warm_ranks.py)."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import free_port, read_jsonl
from trainer_fixtures import (
    assert_complete,
    demo_model,
    launch_flags,
    run_trainer,
    seed_flags,
    torchrun,
    tracked_job,
    trainer_env,
)
from warm_ranks import WarmLauncher

pytestmark = pytest.mark.slow
__all__ = ["demo_model", "tracked_job"]  # fixtures, used by name

STEPS = 6
HELD_JOB = Path(__file__).resolve().parent / "held_job.py"


def test_embedded_relay_records_every_rank(tracked_job: dict) -> None:
    """The shared job's embedded relay (its Aim sink is read in tests/test_aim_torchrun.py)."""
    out = tracked_job["out"]
    assert tracked_job["returncode"] == 0, tracked_job["stderr"]
    run = assert_complete(read_jsonl(out / "training_logs.jsonl"), world_size=2, steps=STEPS, eval_steps=3)
    assert json.loads((out / "tracking_run.json").read_text())["run"] == run
    assert not tracked_job["orphans"], "the embedded relay outlived the job"


def test_external_relay_started_mid_run_loses_nothing(demo_model: Path, tmp_path: Path, relays,
                                                      warm_launcher: WarmLauncher) -> None:
    """The relay is down when the job starts and comes up once rank 0 has logged a step. The job
    (tests/held_job.py) holds its ranks after step 2 until the relay is up, so the relay comes up
    mid-run however slow the machine is (before, 150 steps were to make that likely: 28-30 CPU-s)."""
    out, gate = tmp_path / "out", tmp_path / "relay-up"
    port = free_port()
    relay = relays(["--sink", "jsonl", "--path", str(tmp_path / "relay.jsonl")],
                   address=f"tcp://127.0.0.1:{port}", start=False)
    argv = (launch_flags(free_port())[:-2] + [str(HELD_JOB)] + seed_flags(demo_model, out, steps=STEPS, eval_steps=None)
            + ["--relay_address", relay.address, "--run_name", "late-relay"])
    with open(tmp_path / "job.err", "w") as err:
        job = warm_launcher.start(argv, trainer_env(HELD_JOB_AT="2", HELD_JOB_UNTIL=str(gate)),
                                  stdout=subprocess.PIPE, stderr=err)
    try:
        for line in job.stdout:  # the Trainer prints each log dict on rank 0's stdout
            if "'loss'" in line:
                break
        relay.start()
        relay_up = time.time()
        gate.touch()
        job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    stderr = (tmp_path / "job.err").read_text()
    assert job.returncode == 0, stderr[-3000:]
    assert relay.stop() == 0
    assert not (out / "training_logs.jsonl").exists(), "nothing is started beside the job with --relay_address"
    events = read_jsonl(tmp_path / "relay.jsonl")
    assert assert_complete(events, world_size=2, steps=STEPS, eval_steps=None).startswith("late-relay-")
    end = next(e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "train_end")
    assert relay_up < end["ts"], "the relay came up only after training ended; the test proves less than it says"
    early = [e for e in events if e["stage"] == "train" and "loss" in e["data"] and e["ts"] < relay_up]
    assert early, "no step was logged before the relay came up; the test proves less than it says"
    assert "never acknowledged" not in stderr


def test_external_relay_side_by_side(demo_model: Path, tracked_job: dict, tmp_path: Path, relays) -> None:
    """Also the second job under the shared job's ``--run_name`` (trainer_fixtures.tracked_job): two jobs
    must not share a run id even then, and no job runs for that alone (a two-rank job is about 20
    CPU-seconds, nearly all of it imports)."""
    first = json.loads((tracked_job["out"] / "tracking_run.json").read_text())["run"]
    name = first.rsplit("-", 1)[0]  # the id is the run name and a random suffix
    out = tmp_path / "out"
    relay = relays(["--sink", "jsonl", "--path", str(tmp_path / "relay.jsonl")])
    done = run_trainer(torchrun(free_port()) + seed_flags(demo_model, out, steps=STEPS, eval_steps=3)
                       + ["--relay_address", relay.address, "--run_name", name])
    assert done.returncode == 0, done.stderr[-3000:]
    assert relay.stop() == 0
    run = assert_complete(read_jsonl(tmp_path / "relay.jsonl"), world_size=2, steps=STEPS, eval_steps=3)
    assert run.startswith(f"{name}-") and run != first, f"two jobs must get two run ids: {run}, {first}"
