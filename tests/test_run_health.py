"""relay/daemon/run_health.py on its own and as ingest feeds it: each run's last step, pace, ranks'
figures, attempt, end and opt-in loss, with the clock given by the test."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from relay.daemon.cross_rank import ClusterConfig
from relay.daemon.ingest import Ingest
from relay.daemon.run_health import PACE_STEPS, RunHealth
from relay.journal.deadletter import DeadLetters
from relay.journal.journal import Journal
from relay.wire import encoding


def ev(rank: int, step: int | None, stage: str | None = "rank", type: str = "metrics", run: str = "r",
       world: int = 2, **data: Any) -> dict[str, Any]:
    return {"run": run, "rank": rank, "world_size": world, "type": type, "stage": stage, "step": step, "data": data}


def test_last_step_pace_and_each_rank_figures() -> None:
    health = RunHealth()
    for step in range(1, 6):  # a logged step every 2 s, rank 1 slower at its own work
        health.observe(ev(0, step, step_time=0.5, own_time=0.2), now=10.0 + 2 * step)
        health.observe(ev(1, step, step_time=0.5, own_time=0.45), now=10.1 + 2 * step)
    (name, view), = health.view(10).items()
    assert name == "r" and view.world_size == 2
    assert (view.last_step, view.last_step_at) == (5, 20.0)  # the first rank to report it
    assert view.steps_per_s == pytest.approx(0.5) and view.interval_median_s == pytest.approx(2.0)
    assert view.step_time == {0: 0.5, 1: 0.5} and view.own_time == {0: 0.2, 1: 0.45}
    assert view.rank_step == {0: 5, 1: 5}
    assert view.loss is None and view.attempt is None and view.ended_at is None


def test_a_run_without_per_rank_windows_takes_its_steps_from_its_metrics_events() -> None:
    """A custom loop's Publisher (or the accelerate tracker) sends only metrics events: their steps give
    the run its last step and pace; once a run sends per-rank windows, those alone move its steps."""
    health = RunHealth()
    for step in range(1, 6):  # the frame's last metrics event counts; params and rank-less steps do not
        health.take_steps([ev(0, step, stage="train", loss=1.0 / step), ev(0, None, stage="train", lr=0.1),
                           ev(0, step * 100, type="params", stage="run")], now=2.0 * step)
    view = health.view(10)["r"]
    assert (view.last_step, view.last_step_at) == (5, 10.0)
    assert view.steps_per_s == pytest.approx(0.5) and view.interval_median_s == pytest.approx(2.0)
    assert view.rank_step == {} and view.step_time == {}  # per-rank figures only from per-rank windows

    health.observe(ev(1, 6, step_time=0.5), now=12.0)  # this run now sends windows
    health.take_steps([ev(0, 50, stage="train", loss=0.1)], now=13.0)
    view = health.view(10)["r"]
    assert (view.last_step, view.last_step_at, view.rank_step) == (6, 12.0, {1: 6})


def test_one_step_has_no_pace_yet_and_the_pace_window_is_bounded() -> None:
    health = RunHealth()
    health.observe(ev(0, 1, step_time=0.1), 0.0)
    view = health.view(1)["r"]
    assert view.last_step == 1 and view.steps_per_s is None and view.interval_median_s is None
    for step in range(2, 1000):
        health.observe(ev(0, step, step_time=0.1), float(step))
    assert len(health.runs["r"].pace) == PACE_STEPS


def test_unusable_figures_and_ranks_beyond_the_world_are_left_out() -> None:
    health = RunHealth()
    health.observe(ev(0, 1, step_time=float("nan"), own_time="x"), 0.0)
    health.observe(ev(5, 9, step_time=0.1), 0.0)  # rank 5 of a world of 2
    view = health.view(1)["r"]
    assert view.step_time == {} and view.own_time == {} and view.last_step == 1


def test_the_loss_is_the_last_one_of_a_frame() -> None:
    health = RunHealth(loss=True)
    health.observe(ev(0, 3, stage="train", loss=1.25), 0.0)
    assert "r" not in health.runs, "observe takes no loss"
    health.take_loss([ev(0, 3, stage="train", loss=1.25), ev(0, 4, stage="train", loss=1.0, learning_rate=1e-5),
                      ev(0, 4, stage="train", train_runtime=9.0), ev(0, 4, stage="rank", step_time=0.1)])
    assert health.view(1)["r"].loss == 1.0, "the frame's last loss"


def test_attempt_end_and_expiry() -> None:
    health = RunHealth(keep_ended=300.0)
    health.observe(ev(0, 0, stage=None, type="lifecycle", event="train_begin", attempt=2), 0.0)
    health.observe(ev(0, 4, step_time=0.1), 1.0)
    health.observe(ev(0, 4, stage=None, type="lifecycle", event="train_end", status="failed"), 5.0)
    view = health.view(1)["r"]
    assert (view.attempt, view.ended_at, view.status) == (2, 5.0, "failed")
    health.expire(304.9)
    assert "r" in health.runs
    health.expire(305.0)
    assert health.runs == {}


def test_view_lists_the_most_recent_steps_first_up_to_its_limit() -> None:
    health = RunHealth()
    for i, run in enumerate(["a", "b", "c"]):
        health.observe(ev(0, 1, run=run, step_time=0.1), float(i))
    assert list(health.view(2)) == ["c", "b"]


@pytest.mark.parametrize("cluster", [None, ClusterConfig()])
def test_ingest_feeds_health_from_compact_frames_and_forgets_with_the_run(tmp_path: Path, cluster: Any) -> None:
    journal = Journal(str(tmp_path / "journal") + os.sep)
    journal.open()
    health = RunHealth(loss=True)
    ingest = Ingest(journal, DeadLetters(journal.sidecar("_deadletter.jsonl")), 0.0, cluster=cluster, health=health,
                    send_acks=lambda peer, acks: None)  # no clients here to acknowledge
    try:
        for rank in (0, 1):
            prefix = encoding.compact_prefix({"v": 1, "run": "r", "rank": rank, "local_rank": rank, "world_size": 2,
                                              "host": "h"})
            rows = [encoding.encode_row(0, 1.0, "lifecycle", 0, 0.0, None, {"event": "train_begin", "attempt": 1})]
            for step in (1, 2, 3):
                rows.append(encoding.encode_row(2 * step - 1, 1.0, "metrics", step, None, "rank",
                                                {"step_time": 0.2 + rank, "own_time": 0.1 + rank}))
                rows.append(encoding.encode_row(2 * step, 1.0, "metrics", step, None, "train",
                                                {"loss": 3.0 - step + 10 * rank}))  # rank 0's counts
            ingest.take_frame(b"peer%d" % rank, encoding.compact_frame(prefix, rows), now=float(rank))
        view = health.view(5)["r"]
        assert (view.last_step, view.attempt, view.loss) == (3, 1, 0.0)
        assert view.step_time == {0: 0.2, 1: 1.2} and view.own_time == {0: 0.1, 1: 1.1}
        ingest.commit(2.0)
        assert ingest.forget("r", 3.0)
        assert health.runs == {}
    finally:
        journal.close()
        ingest.deadletters.close()
