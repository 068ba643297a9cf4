"""The one line in stacks we do not run (issue 39): ``RelayCallback()`` in a plain Trainer script, in a
real fms-hf-tuning 3.2.2 job at its own pins (the compatibility venv, tests/compat_env.py), and the
files other tools write beside ours. Real torchrun, real relays, fms's real file logger."""
from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from compat_env import ROOT, fms_env, fms_model, fms_python, run_fms
from conftest import free_port, read_jsonl
from sink_readback import read_repo
from trainer_fixtures import DEMO_DATA, demo_model, trainer_env

__all__ = ["demo_model", "fms_model"]  # fixtures, used by name

PLAIN_JOB = Path(__file__).resolve().parent / "plain_trainer_job.py"
FMS_JOB = Path(__file__).resolve().parent / "fms_job.py"
RELAY_RANK = 2**24 - 1  # the relay's own events (sinks/events.py)
STEPS = 4


def _torchrun(python: str, port: int, nproc: int = 2) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
            f"--master_port={port}"]


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)


def _relays_left(out: Path) -> list[str]:
    return [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])
            if "relay" in " ".join(p.info["cmdline"] or []) and str(out) in " ".join(p.info["cmdline"] or [])]


def _check_job(events: list[dict], *, world_size: int, steps: int, status: str = "completed") -> str:
    """One run, every rank's seqs whole, the Trainer's loss at every step from rank 0, every rank's
    windows, the run's end; returns the run id."""
    own = [e for e in events if e["rank"] != RELAY_RANK]
    runs = {e["run"] for e in events}
    assert len(runs) == 1, runs
    for rank in range(world_size):
        seqs = sorted(e["seq"] for e in own if e["rank"] == rank)
        assert seqs and seqs == list(range(len(seqs))), f"rank {rank}: {seqs}"
    losses = [e["step"] for e in own if e["stage"] == "train" and "loss" in e["data"]]
    assert losses == list(range(1, steps + 1)), losses
    windows = {(e["rank"], e["step"]) for e in own if e["stage"] == "rank"}
    assert windows == {(r, s) for r in range(world_size) for s in range(1, steps + 1)}, windows
    ends = [e["data"] for e in own if e["type"] == "lifecycle" and e["data"]["event"] == "train_end"]
    assert [end["status"] for end in ends] == [status], ends
    return runs.pop()


@pytest.mark.slow
def test_one_line_in_a_plain_trainer_under_torchrun(demo_model: Path, tmp_path: Path) -> None:
    """``Trainer(callbacks=[RelayCallback()])`` and nothing else: two ranks agree on a run named by
    ``args.run_name``, the relay rank 0 started beside the job journals both and feeds the tracker the
    environment asked for (Aim, read back through Aim's API), and is gone when the job is."""
    out = tmp_path / "out"
    done = _run(_torchrun(sys.executable, free_port()) + [str(PLAIN_JOB), str(out), str(STEPS),
                                                           "--run-name", "plain job"],
                trainer_env(DEMO_MODEL_DIR=str(demo_model), RELAY_TRACKERS="aim",
                            RELAY_AIM_REPO=str(tmp_path / "aim"), RELAY_EXPERIMENT="drop-in"))
    assert done.returncode == 0, done.stderr[-3000:]
    events = read_jsonl(out / "training_logs.jsonl")
    run = _check_job(events, world_size=2, steps=STEPS)
    assert run.startswith("plain-job-"), run
    assert sorted(e["rank"] for e in events if e["data"].get("rows") == 268) == [0, 1], "track() before the Trainer"
    assert json.loads((out / "tracking_run.json").read_text())["run"] == run
    assert not _relays_left(out), "the embedded relay outlived the job"
    aim = read_repo(str(tmp_path / "aim"))[run]
    assert aim.experiment == "drop-in" and not aim.active
    losses = [sorted(series) for (name, _context), series in aim.metrics.items() if name == "loss"]
    assert list(range(1, STEPS + 1)) in losses, aim.metrics.keys()


@pytest.mark.slow
def test_one_line_at_fms_hf_tuning_pins(fms_model: Path, tmp_path: Path) -> None:
    """The same script in the compatibility venv: transformers 4.55, trl and peft absent from the path
    the callback takes."""
    out = tmp_path / "out"
    done = _run(_torchrun(fms_python(), free_port()) + [str(PLAIN_JOB), str(out), str(STEPS)],
                fms_env(DEMO_MODEL_DIR=str(fms_model)))
    assert done.returncode == 0, done.stderr[-3000:]
    events = read_jsonl(out / "training_logs.jsonl")
    _check_job(events, world_size=2, steps=STEPS)
    versions = next(e["data"] for e in events if e["stage"] == "versions")
    assert versions["transformers"] == "4.55.4", versions
    assert not _relays_left(out)


@pytest.mark.slow
def test_callback_tests_pass_at_fms_pins() -> None:
    """The callback's own tests (this module's fast ones, the accelerate tracker's, the tracking API's
    and the log splitting of tests/test_trainer.py) in the compatibility venv, by its own pytest."""
    done = run_fms(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", "tests/test_drop_in.py",
                    "tests/test_accelerate_tracker.py", "tests/test_trainer.py", "-k",
                    "drop_in or accelerate or split_by_stage or tracking_api or tracked_before or never_sent "
                    "or run_id_sources"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    ran = re.search(r"ran (\d+) \((\d+) passed, 0 failed\)", done.stdout)
    assert ran and int(ran.group(1)) == int(ran.group(2)) >= 20 and "skipped 0" in done.stdout, done.stdout[-2000:]


@pytest.mark.slow
def test_fms_hf_tuning_job_with_the_callback(fms_model: Path, tmp_path: Path) -> None:
    """fms-hf-tuning's own ``sft_trainer.train(..., additional_callbacks=[RelayCallback(...)])``, two
    ranks: the journal holds every rank and fms's file logger's loss at every step, the job's
    ``exp_metadata`` is the run's, and fms's own ``training_logs.jsonl`` stays fms's alone (the relay
    says, once, that it wrote its journal beside it)."""
    out = tmp_path / "out"
    flags = ["--model_name_or_path", str(fms_model), "--training_data_path", str(DEMO_DATA),
             "--dataset_text_field", "output", "--response_template", "\n### Response:", "--output_dir", str(out),
             "--max_steps", str(STEPS), "--logging_strategy", "steps", "--logging_steps", "1",
             "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--torch_dtype", "float32",
             "--use_flash_attn", "False", "--use_cpu", "True", "--save_strategy", "no",
             "--exp_metadata", json.dumps({"dataset": "demo-v1"})]
    done = _run(_torchrun(fms_python(), free_port()) + [str(FMS_JOB), *flags], fms_env())
    assert done.returncode == 0, done.stderr[-3000:]
    fms_lines = [json.loads(line) for line in (out / "training_logs.jsonl").read_text().splitlines()]
    assert {line["name"] for line in fms_lines} == {"training_loss"}, "only fms's file logger wrote it"
    fms_loss = {line["data"]["step"]: line["data"]["value"] for line in fms_lines}
    assert sorted(fms_loss) == list(range(1, STEPS + 1))
    events = read_jsonl(out / "relay_training_logs.jsonl")
    _check_job(events, world_size=2, steps=STEPS)
    ours = {e["step"]: e["data"]["loss"] for e in events if e["stage"] == "train" and "loss" in e["data"]}
    assert ours == fms_loss
    meta = [e for e in events if e["stage"] == "experiment_metadata"]
    assert [(e["rank"], e["data"]) for e in meta] == [(0, {"dataset": "demo-v1"})]
    said = [line for line in done.stderr.splitlines() if "is fms-hf-tuning's file logger's; the relay's journal is" in line]
    assert len(said) == 1, done.stderr[-3000:]
    assert not _relays_left(out)


@pytest.mark.slow
def test_a_job_that_dies_of_its_own_error_still_ends_its_run(demo_model: Path, tmp_path: Path) -> None:
    """Training raises at step 2 (no on_train_end): the run still ends, failed, and the relay the
    callback started is stopped, not left running."""
    out = tmp_path / "out"
    done = _run([sys.executable, str(PLAIN_JOB), str(out), str(STEPS), "--fail-at", "2"],
                trainer_env(DEMO_MODEL_DIR=str(demo_model)))
    assert done.returncode == 1 and "failing at step 2 as asked" in done.stderr, done.stderr[-3000:]
    events = read_jsonl(out / "training_logs.jsonl")
    ends = [e["data"] for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "train_end"]
    assert [end["status"] for end in ends] == ["failed"], ends
    assert not _relays_left(out)


@pytest.mark.slow
def test_relay_address_from_the_environment(demo_model: Path, tmp_path: Path, relays) -> None:
    """RELAY_ADDRESS: the ranks publish to the relay the platform runs, and nothing starts beside the job."""
    relay = relays(["--sink", "jsonl", "--path", str(tmp_path / "relay.jsonl")])
    out = tmp_path / "out"
    done = _run([sys.executable, str(PLAIN_JOB), str(out), str(STEPS)],
                trainer_env(DEMO_MODEL_DIR=str(demo_model), RELAY_ADDRESS=relay.address))
    assert done.returncode == 0, done.stderr[-3000:]
    assert relay.stop() == 0
    _check_job(read_jsonl(tmp_path / "relay.jsonl"), world_size=1, steps=STEPS)
    assert not (out / "training_logs.jsonl").exists()


def test_settings_from_keywords_and_the_environment() -> None:
    from transformers import HfArgumentParser

    from trainer.job_settings import JobSettings
    from trainer.tracker_flags import TrackingArguments

    HfArgumentParser(TrackingArguments)  # as python -m trainer's parse does: it retypes the dataclass's fields

    env = {"RELAY_TRACKERS": "aim,mlflow", "RELAY_AIM_REPO": "/data/aim", "RELAY_FLUSH_TIMEOUT": "12",
           "RELAY_TIME_COLLECTIVES": "no", "RELAY_EXPERIMENT": " "}
    settings = JobSettings.read({}, env)
    assert settings.trackers == ["jsonl", "aim", "mlflow"] and settings.tracking.aim_repo == "/data/aim"
    assert settings.tracking.relay_flush_timeout == 12.0 and settings.tracking.time_collectives is False
    assert settings.tracking.experiment is None, "a blank variable is no setting"
    given = JobSettings.read({"trackers": ["tensorboard"], "exp_metadata": {"dataset": "v3"}}, env)
    assert given.trackers == ["jsonl", "tensorboard"] and given.exp_metadata == {"dataset": "v3"}
    assert not JobSettings.read({"trackers": "none"}, {}).on


@pytest.mark.parametrize(("given", "env", "message"), [
    ({"aim_rep": "x"}, {}, "unknown tracking option 'aim_rep'; known: trackers, aim_repo"),
    ({}, {"RELAY_FLUSH_TIMEOUT": "soon"}, "RELAY_FLUSH_TIMEOUT='soon': could not convert"),
    ({}, {"RELAY_TIME_COLLECTIVES": "maybe"}, "RELAY_TIME_COLLECTIVES='maybe': not one of"),
    ({"trackers": ["aim", "nope"]}, {}, "unknown tracker 'nope'"),
    ({}, {"RELAY_ADDRESS": "tcp://127.0.0.1:99999"}, "--relay_address"),
])
def test_bad_settings_are_one_line(given: dict, env: dict, message: str) -> None:
    from trainer.job_settings import JobSettings

    with pytest.raises(ValueError) as caught:
        JobSettings.read(given, env)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_journal_never_goes_into_another_tools_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from trainer.embedded import JSONL_NAME, OWN_JSONL_NAME, journal_name_in

    assert journal_name_in(str(tmp_path)) == JSONL_NAME
    ours = tmp_path / JSONL_NAME
    ours.write_text(json.dumps({"v": 1, "run": "r", "rank": 0, "seq": 0, "type": "hello"}) + "\n")
    assert journal_name_in(str(tmp_path)) == JSONL_NAME, "a journal of an earlier job of ours goes on"
    ours.write_text('{"data": {"step": 1, "value": 2.5}, "name": "training_loss"}\n')
    with caplog.at_level(logging.WARNING):
        assert journal_name_in(str(tmp_path)) == OWN_JSONL_NAME
    assert [r.getMessage() for r in caplog.records] == [
        f"{JSONL_NAME} in {tmp_path} is a file the relay did not write; the relay's journal is "
        f"{tmp_path / OWN_JSONL_NAME}"]


def test_tracker_files_of_other_tools_stay(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """fms-hf-tuning's ``aim_tracker.json`` is left byte for byte; ours goes beside it, said once."""
    from collections import Counter

    from sinks.tracker_export import write_tracker_file

    theirs = tmp_path / "aim_tracker.json"
    theirs.write_text('{"run_hash": "fms0001"}')
    counters: Counter[str] = Counter()
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            write_tracker_file(theirs, {"run_hash": "ours01", "run_id": "r1"}, counters, "aim", "r1")
    assert theirs.read_text() == '{"run_hash": "fms0001"}'
    assert json.loads((tmp_path / "relay_aim_tracker.json").read_text())["run_hash"] == "ours01"
    assert len(caplog.records) == 1 and "relay_aim_tracker.json" in caplog.records[0].getMessage()
    mine = tmp_path / "mlflow_tracker.json"
    write_tracker_file(mine, {"run_id": "a"}, counters, "mlflow", "a")
    write_tracker_file(mine, {"run_id": "b"}, counters, "mlflow", "b")
    assert json.loads(mine.read_text())["run_id"] == "b", "a file of ours is ours to replace"
    assert not counters


def test_callback_with_a_publisher_takes_no_settings() -> None:
    from relay.client.publisher import Publisher
    from trainer import RelayCallback

    with (Publisher("settings-test", 0, address=None) as pub,
          pytest.raises(ValueError, match="tracking settings need no publisher")):
        RelayCallback(pub, trackers=["aim"])


@pytest.mark.slow  # the compatibility venv: make test builds it, make test-fast does not
def test_our_entry_point_at_fms_pins_says_what_it_needs(tmp_path: Path) -> None:
    """``python -m trainer`` needs transformers 5 and trl 1: at fms-hf-tuning's pins it says so in one line,
    and the way in that works there, before anything is parsed or started."""
    done = run_fms(["-m", "trainer", "--demo", "--output_dir", str(tmp_path / "out")])
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert "ERROR trainer: python -m trainer needs transformers>=5.0 (this environment has 4.55.4), trl>=1.0" in line
    assert "RelayCallback()" in line and not (tmp_path / "out").exists()
