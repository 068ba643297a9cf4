"""A resumed job's second attempt in every tracker (issue 28): the sink is given a run whose first
attempt logged steps 4 and 5 past its checkpoint at 3 and died, then the second attempt's steps 4-6
(sink_helpers.resumed_events), in one sink process as a live relay hands them over. Read back through
each tracker's own library: one run, named by the job's --run_name, each step's last value the
second attempt's where the tracker can replace or drop a point; MLflow keeps both points of steps 4
and 5, the later one the second attempt's (docs/sinks/mlflow.md)."""
from __future__ import annotations

from pathlib import Path

import pytest

import sink_readback as rb
from sink_helpers import aim_repo, drive, resumed_events  # noqa: F401 (aim_repo: a fixture)

EXPECTED = {1: 1.0, 2: 0.5, 3: 1 / 3, 4: 2.5, 5: 2.0, 6: 10 / 6}  # 1-3 the first attempt's, 4-6 the second's


def test_tensorboard_purges_the_first_attempts_later_steps(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from sinks.tensorboard import TensorBoardSink

    drive(TensorBoardSink(logdir=str(tmp_path / "tb")), [resumed_events("job-r")])
    (board,) = rb.read_logdir(tmp_path / "tb").values()
    assert board.series("train/loss") == {s: rb.f32(v) for s, v in EXPECTED.items()}  # series(): no step twice


def test_aim_keeps_the_last_attempts_value_at_each_step(aim_repo: Path) -> None:
    from sinks.aim import AimSink

    drive(AimSink(repo=str(aim_repo)), [resumed_events("job-r")])
    (view,) = rb.read_repo(str(aim_repo)).values()
    assert view.series("loss") == pytest.approx(EXPECTED)
    assert view.name == "named-job"


def test_wandb_rewinds_the_run_to_before_the_first_attempts_later_steps(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    from sinks.wandb import WandbSink

    sink = drive(WandbSink(wandb_project="relay-tests", wandb_dir=str(tmp_path)), [resumed_events("job-r")])
    assert sink.counters["rewinds"] == 1
    view = rb.read_wandb(tmp_path)["job-r"]
    assert view.series["train/loss"] == pytest.approx(EXPECTED)
    assert sorted(row["train/global_step"] for row in view.rows if "train/loss" in row) == list(EXPECTED)
    assert [i["rewind"] for i in view.instances] == [None, 2], "rewound to the 3rd row (_step 2), step 3's"
    assert view.name == "named-job" and view.config["relay.attempts.1"]["resumed_from"] == 3


def test_mlflow_keeps_both_attempts_points_the_later_one_the_second_attempts(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from sinks.mlflow import MlflowSink

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    drive(MlflowSink(uri, rb.EXPERIMENT), [resumed_events("job-r")])
    view = rb.read_run(uri, "job-r")  # one run
    assert view.info.run_name == "named-job" and view.info.status == "FINISHED"
    points = view.history["loss"]
    assert [step for step, _, _ in points] == [1, 2, 3, 4, 4, 5, 5, 6]
    latest = {step: value for step, value, _ in sorted(points, key=lambda p: (p[0], p[2]))}
    assert latest == pytest.approx(EXPECTED), "at each step, the latest point is the last attempt's"
    assert "resumed_from" in view.params["relay.attempts.1"]


def test_clearml_reports_the_last_attempts_value_last(tmp_path: Path) -> None:
    pytest.importorskip("clearml")
    from sinks.clearml import ClearmlSink

    drive(ClearmlSink(clearml_project="relay-tests", clearml_dir=str(tmp_path)), [resumed_events("job-r")])
    (view,) = rb.read_sessions(tmp_path, last_wins=True).values()  # one value per iteration, as a server keeps
    assert view.scalars[("train", "loss")] == pytest.approx(EXPECTED)
