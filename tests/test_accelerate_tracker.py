"""``Accelerator(log_with=[RelayTracker()])`` (issue 39 §5): a real accelerate loop, alone and as two
ranks under torchrun (gloo, CPU), in this venv and at fms-hf-tuning 3.2.2's pins (the compatibility
venv, tests/compat_env.py); the journal the embedded relay wrote read back."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from compat_env import fms_env, fms_python
from conftest import free_port, read_jsonl
from test_drop_in import RELAY_RANK, _relays_left, _run, _torchrun
from trainer_fixtures import trainer_env

JOB = Path(__file__).resolve().parent / "accelerate_job.py"
STEPS = 4


def _stage(events: list[dict], stage: str) -> list[dict]:
    return [e for e in events if e["stage"] == stage]


@pytest.mark.slow
@pytest.mark.parametrize("venv", ["main", "fms"])
def test_two_ranks_under_torchrun(venv: str, tmp_path: Path) -> None:
    """init_trackers -> the run's params (rank 0's config), accelerator.log -> every rank's own loss at
    its step, end_training -> rank 0's train_end, every rank flushed (its closing stats journaled),
    the embedded relay gone; accelerate's other trackers still called on the main process only."""
    out = tmp_path / "project"
    python, env = (sys.executable, trainer_env()) if venv == "main" else (fms_python(), fms_env())
    done = _run(_torchrun(python, free_port()) + [str(JOB), str(out), str(STEPS)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [e for e in read_jsonl(out / "training_logs.jsonl") if e["rank"] != RELAY_RANK]
    runs = {e["run"] for e in events}
    assert len(runs) == 1 and runs.pop().startswith("accelerate-demo-"), runs
    for rank in (0, 1):
        mine = [e for e in events if e["rank"] == rank]
        assert sorted(e["seq"] for e in mine) == list(range(len(mine))), f"rank {rank}: a gap"
        assert [e["step"] for e in _stage(mine, "train")] == list(range(1, STEPS + 1))
        assert all(e["epoch"] == 0 and set(e["data"]) == {"loss"} for e in _stage(mine, "train"))
        assert [(e["step"], e["data"]) for e in _stage(mine, "eval")] == [(STEPS, {"loss": 0.5})]
        assert [e["data"] for e in _stage(mine, "additional_metrics")] == [{"rows": 64}], "track() first"
        assert [e["type"] for e in mine][-1] == "stats", f"rank {rank} did not close its publisher"
    from accelerate_job import CONFIG  # torch and accelerate: not at collection

    first = {e["rank"]: e["data"]["loss"] for e in _stage(events, "train") if e["step"] == 1}
    assert first[0] != first[1], "each rank logs its own loss"
    assert [(e["rank"], e["data"]) for e in _stage(events, "hparams")] == [(0, CONFIG)]
    [run] = [e["data"] for e in _stage(events, "run")]
    assert run["project"] == "accelerate demo" and run["world_size"] == 2 and run["embedded_relay"]
    ends = [(e["rank"], e["data"]) for e in events if e["type"] == "lifecycle"]
    assert [(rank, data["event"], data.get("status")) for rank, data in ends] == [
        (0, "train_begin", None), (0, "train_end", "completed")]
    assert ends[-1][1]["global_step"] == STEPS
    assert json.loads((out / "tracking_run.json").read_text())["run"] == events[0]["run"]
    assert not _relays_left(out), "the embedded relay outlived the job"
    assert json.loads((out / "calls-rank0.json").read_text()) == {
        "start": 1, "store_init_configuration": 1, "log": STEPS + 1, "finish": 1}
    assert not (out / "calls-rank1.json").exists(), "accelerate called another tracker off its main process"
    said = [line for line in done.stderr.splitlines() if "'note' is a str, not a number" in line]
    assert len(said) == 2, done.stderr[-3000:]  # once per rank


@pytest.mark.slow
def test_a_loop_that_dies_still_ends_its_run(tmp_path: Path) -> None:
    """The loop raises before end_training: the run ends, failed, and the relay is stopped."""
    out = tmp_path / "project"
    done = _run([sys.executable, str(JOB), str(out), str(STEPS), "--fail-at", "2"], trainer_env())
    assert done.returncode == 1 and "failing at step 2 as asked" in done.stderr, done.stderr[-3000:]
    events = read_jsonl(out / "training_logs.jsonl")
    assert [e["step"] for e in _stage(events, "train")] == [1]
    ends = [e["data"] for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "train_end"]
    assert [end["status"] for end in ends] == ["failed"], ends
    assert not _relays_left(out)


@pytest.mark.slow
def test_relay_address_from_the_environment(tmp_path: Path, relays) -> None:
    """RELAY_ADDRESS: the loop publishes to the relay the platform runs; nothing starts beside it."""
    relay = relays(["--sink", "jsonl", "--path", str(tmp_path / "relay.jsonl")])
    out = tmp_path / "project"
    done = _run([sys.executable, str(JOB), str(out), str(STEPS)], trainer_env(RELAY_ADDRESS=relay.address))
    assert done.returncode == 0, done.stderr[-3000:]
    assert relay.stop() == 0
    events = read_jsonl(tmp_path / "relay.jsonl")
    assert [e["step"] for e in _stage(events, "train")] == list(range(1, STEPS + 1))
    assert [e["data"]["status"] for e in events if e["data"].get("event") == "train_end"] == ["completed"]
    assert not (out / "training_logs.jsonl").exists()


def test_logged_values_as_figures() -> None:
    import numpy as np
    import torch

    from trainer.accelerate_tracker import _figure

    assert _figure(2) == 2 and type(_figure(2)) is int
    assert _figure(np.float32(0.5)) == 0.5 and type(_figure(np.float32(0.5))) is float
    assert _figure(torch.tensor(1.5)) == 1.5 and _figure(torch.tensor([3])) == 3
    assert _figure(float("nan")) != _figure(float("nan")), "NaN is kept"
    for not_a_figure in ("text", True, None, torch.tensor([1.0, 2.0]), [1.0], {"a": 1}):
        assert _figure(not_a_figure) is None, not_a_figure


def test_bad_settings_and_options_are_one_line() -> None:
    from trainer import RelayTracker

    with pytest.raises(ValueError) as caught:
        RelayTracker(aim_rep="x")
    assert "unknown tracking option 'aim_rep'" in str(caught.value) and "\n" not in str(caught.value)
    tracker = RelayTracker(trackers=["aim"], aim_repo="/data/aim")
    with pytest.raises(TypeError, match="RelayTracker.log takes no options .log_kwargs., got context"):
        tracker.log({"loss": 1.0}, step=1, context="x")
    assert tracker.tracker is None, "nothing opened before init_trackers"
    assert (tracker.name, tracker.main_process_only, tracker.requires_logging_directory) == ("relay", False, False)
