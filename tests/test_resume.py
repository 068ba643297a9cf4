"""A resumed job is one run (issue 28): a real two-rank job (torchrun's agent, warm ranks:
tests/warm_ranks.py) with every tracker (the suite's one
job with all five trackers at once) saves
checkpoint-4, logs steps 5 and 6, and is SIGKILLed; a second job resumes from the checkpoint. The
journal holds one run, with each attempt and the step it resumed from, and no seq twice; each
tracker, read back through its own library, holds one run, with each step's last value from the
second attempt (MLflow, which keeps every point, as docs/sinks/mlflow.md says). One job (two
attempts) serves every test of this module, built once per test run."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

import psutil
import pytest

from conftest import free_port, once_per_run, read_jsonl, wait_for
from sinks.events import RELAY_RANK, attempt_base, attempt_of
from trainer_fixtures import demo_model, launch_flags, seed_flags, trainer_env
from warm_ranks import WarmLauncher

pytestmark = pytest.mark.slow
__all__ = ["demo_model"]  # a fixture, used by name

JOB = Path(__file__).resolve().parent / "held_job.py"
SINKS = ("aim", "mlflow", "tensorboard", "wandb", "clearml")
STEPS, SAVED, HELD = 8, 4, 6  # max_steps; the checkpoint the second attempt resumes from; the last step of the first
RUN_NAME = "resumed-job"


def _command(model: Path, out: Path, *extra: str) -> list[str]:
    flags = seed_flags(model, out, steps=STEPS, eval_steps=SAVED)
    flags[flags.index("--save_steps") + 1] = str(SAVED)
    flags[flags.index("--save_total_limit") + 1] = "3"
    return [*launch_flags(free_port())[:-2], str(JOB), *flags, "--run_name", RUN_NAME, "--tracker", ",".join(SINKS),
            "--experiment", "resume", *extra]


def _first_attempt(launcher: WarmLauncher, model: Path, out: Path) -> None:
    """Run until both ranks logged step HELD (and checkpoint-SAVED is saved), then SIGKILL the job
    (torchrun's agent and its ranks); its embedded relay, in a session of its own, sees rank 0 gone and stops."""
    with open(out.parent / "first-attempt.log", "w") as log:
        job = launcher.start(_command(model, out), trainer_env(HELD_JOB_AT=str(HELD)), stdout=log,
                             stderr=subprocess.STDOUT)
    journal = out / "training_logs.jsonl"

    def held() -> bool:
        if job.poll() is not None:
            raise AssertionError(f"the first attempt ended by itself: {(out.parent / 'first-attempt.log').read_text()[-3000:]}")
        events = read_jsonl(journal, live=True) if journal.exists() else []
        ranks = {e["rank"] for e in events if e["stage"] == "rank" and e["step"] == HELD}
        return ranks == {0, 1} and any(e["stage"] == "train" and e["step"] == HELD for e in events)

    try:
        wait_for(held, 540, f"both ranks past step {HELD}")
        assert (out / f"checkpoint-{SAVED}" / "tracking_run.json").exists()
    finally:  # the agent and its ranks, not the relay rank 0 started (in a session of its own)
        procs = [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]
        relay = {p.pid for p in procs if p.cmdline()[1:3] == ["-m", "relay"]}
        relay |= {c.pid for p in procs if p.pid in relay for c in p.children(recursive=True)}
        for proc in procs:
            if proc.pid not in relay:
                proc.send_signal(signal.SIGKILL)
        job.wait(30)
    relay_pid = json.loads((out / "tracking_run.json").read_text())["relay_pid"]
    wait_for(lambda: not Path(f"/proc/{relay_pid}").exists(), 400, "the first attempt's relay to stop")


@pytest.fixture(scope="module")
def job(demo_model: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """The output directory of the job after both attempts (one per test run, see the module's docstring)."""
    with once_per_run(tmp_path_factory, "resume") as root:
        out = root / "out"
        if not (root / "job-done").exists():
            shutil.rmtree(root, ignore_errors=True)  # what a failed run on another worker left
            out.mkdir(parents=True)
            launcher = request.getfixturevalue("warm_launcher")
            _first_attempt(launcher, demo_model, out)
            second = launcher.run(_command(demo_model, out, "--resume_from_checkpoint", "True"), trainer_env(),
                                  timeout=540)
            (root / "second-attempt.log").write_text(second.stderr)
            assert second.returncode == 0, second.stderr[-3000:]
            (root / "job-done").touch()
    return out


def _journal(out: Path) -> list[dict]:
    return read_jsonl(out / "training_logs.jsonl")


def last_values(events: list[dict], stage: str, name: str, rank: int = 0) -> dict[int, float]:
    """Each step's value of ``stage``/``name`` from rank ``rank``: the last attempt's, where two logged it."""
    found: dict[int, tuple[int, float]] = {}
    for e in events:
        if e["rank"] == rank and e["stage"] == stage and name in e["data"]:
            attempt = attempt_of(e["seq"])
            if e["step"] not in found or found[e["step"]][0] <= attempt:
                found[e["step"]] = (attempt, e["data"][name])
    return {step: value for step, (_, value) in found.items()}


def test_the_journal_holds_one_run_with_each_attempt_and_no_seq_twice(job: Path) -> None:
    events = _journal(job)
    assert len({e["run"] for e in events}) == 1
    begins = [e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "train_begin"]
    assert [(e["data"]["attempt"], e["data"]["resumed_from"], e["step"]) for e in begins] == [(0, None, 0),
                                                                                               (1, SAVED, SAVED)]
    for rank in (0, 1):
        seqs = [e["seq"] for e in events if e["rank"] == rank]
        assert len(seqs) == len(set(seqs))
        first = sorted(s for s in seqs if s < attempt_base(1))
        second = sorted(s for s in seqs if s >= attempt_base(1))
        assert first == list(range(len(first))) and second == list(range(attempt_base(1), attempt_base(1) + len(second)))
    trained = Counter((attempt_of(e["seq"]), e["step"]) for e in events if e["stage"] == "train" and "loss" in e["data"])
    assert trained == Counter([(0, s) for s in range(1, HELD + 1)] + [(1, s) for s in range(SAVED + 1, STEPS + 1)])
    end = [e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "train_end"]
    assert [(attempt_of(e["seq"]), e["data"]["status"]) for e in end] == [(1, "completed")]
    run_file = json.loads((job / "tracking_run.json").read_text())
    assert (run_file["run"], run_file["attempt"], run_file["resumed_from"]) == (events[0]["run"], 1, SAVED)
    cluster = Counter(e["step"] for e in events if e["rank"] == RELAY_RANK and e["type"] == "metrics")
    assert all(cluster[s] == 2 for s in range(SAVED + 1, HELD + 1)), cluster  # both attempts' steps 5-6


def _run_id(out: Path) -> str:
    return json.loads((out / "tracking_run.json").read_text())["run"]


def _expected(out: Path) -> tuple[dict[int, float], dict[int, float]]:
    """Each step's last loss (rank 0's Trainer log) and rank 1's last step time, from the journal."""
    events = _journal(out)
    return last_values(events, "train", "loss"), last_values(events, "rank", "step_time", rank=1)


def test_tensorboard_one_run_each_step_the_last_attempts(job: Path) -> None:
    from sink_readback import f32, read_logdir

    loss, step_time = _expected(job)
    boards = read_logdir(job / "runs")
    assert list(boards) == [_run_id(job)]
    board = boards[_run_id(job)]  # series(): no step twice, the first attempt's 5 and 6 purged
    assert board.series("train/loss") == {s: f32(v) for s, v in loss.items()}
    assert board.series("workers/rank_step_time_s/rank_1") == {s: f32(v) for s, v in step_time.items()}


def test_aim_one_run_named_by_run_name_each_step_the_last_attempts(job: Path) -> None:
    from sink_readback import read_repo

    loss, step_time = _expected(job)
    runs = read_repo(str(job / "aim"))
    assert list(runs) == [_run_id(job)]
    view = runs[_run_id(job)]
    assert view.name == RUN_NAME and view.experiment == "resume"
    assert view.series("loss") == pytest.approx(loss)
    assert view.series("__system__rank_step_time_s", rank=1) == pytest.approx(step_time)
    assert sorted(view.series("__system__cpu", rank=1)) == list(range(1, STEPS + 1)), "in Aim's System tab"
    assert view.params["relay"]["attempts"]["1"]["resumed_from"] == SAVED


def test_wandb_one_run_rewound_each_step_the_last_attempts(job: Path) -> None:
    from sink_readback import read_wandb

    loss, _ = _expected(job)
    runs = read_wandb(job / "wandb-relay")
    assert list(runs) == [_run_id(job)]
    view = runs[_run_id(job)]
    assert view.name == RUN_NAME
    assert view.series["train/loss"] == pytest.approx(loss)
    assert sorted(row["train/global_step"] for row in view.rows if "train/loss" in row) == list(range(1, STEPS + 1))
    assert any(instance["rewind"] is not None for instance in view.instances)


def test_mlflow_one_run_both_attempts_points_the_later_the_last_attempts(job: Path) -> None:
    from sink_readback import read_run

    loss, step_time = _expected(job)
    view = read_run(f"sqlite:///{job / 'mlflow.db'}", _run_id(job), experiment="resume")
    assert view.info.run_name == RUN_NAME and view.info.status == "FINISHED"
    for key, expected in (("loss", loss), ("workers/rank_step_time_s/rank_1", step_time)):
        points = view.history[key]
        twice = list(range(SAVED + 1, HELD + 1))  # MLflow keeps every point: docs/sinks/mlflow.md
        assert sorted(step for step, _, _ in points) == sorted([*range(1, STEPS + 1), *twice]), key
        latest = {step: value for step, value, _ in sorted(points, key=lambda p: (p[0], p[2]))}
        assert latest == pytest.approx(expected), key


def test_clearml_one_task_each_iteration_the_last_attempts(job: Path) -> None:
    from sink_readback import read_sessions

    loss, step_time = _expected(job)
    tasks = read_sessions(job / "clearml-relay", last_wins=True)
    assert list(tasks) == [_run_id(job)]
    view = tasks[_run_id(job)]
    assert view.scalars[("train", "loss")] == pytest.approx(loss)
    assert view.scalars[(":monitor:rank_step_time_s", "rank 1")] == pytest.approx(step_time)


def test_the_job_ended_with_its_trackers_complete(job: Path) -> None:
    log = (job.parent / "second-attempt.log").read_text()
    assert "trackers complete: aim, clearml, mlflow, tensorboard, wandb applied the run" in log, log[-3000:]
    stats = json.loads((job / "training_logs_stats.json").read_text())
    assert stats["final"] and stats["behind"] == {}
    for name in SINKS:
        sink = stats["sinks"][name]
        assert sink["complete"] and sink["dropped"] == 0 and sink["errors"] == 0, (name, sink)
