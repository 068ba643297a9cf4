"""Stragglers that DDP hides, in real two-rank torchrun jobs (CPU, gloo) on the demo model: rank 1
made slow between steps (its data collator) or inside them (its forward pass) by
tests/slow_rank_job.py is named the straggler by its own work while the ranks' step times stay
level, a balanced run names none, and a rank SIGKILLed mid-run is named lost when the job ends
without it (its peer blocks at the next collective, so nobody goes on)."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from conftest import free_port, read_jsonl
from trainer_fixtures import demo_model, run_trainer, seed_flags, torchrun

from sinks.events import RELAY_RANK

pytestmark = pytest.mark.slow
__all__ = ["demo_model"]  # a fixture, used by name

JOB = Path(__file__).resolve().parent / "slow_rank_job.py"
#: Seconds rank 1 sleeps per batch (two per step: --gradient_accumulation_steps 2). With two ranks
#: the median is their mean, so rank 1 must do 3x the own work of rank 0 to pass the default factor 1.5.
#: On a loaded machine the demo model's own step (0.15 s idle) stretches to a second or more, so the
#: sleep is what no load can make rank 0 match: 4 s a step against rank 0's compute.
SLEEP = "2.0"
#: Seconds every rank sleeps per batch in the balanced run: equal work that load does not stretch.
#: The demo model's compute alone, on two cores shared with other jobs, differs between the ranks by
#: more than 3x for steps on end (a run at load 4-20 named a straggler); the detector is right
#: about such a run, which is not balanced. With 0.5 s of equal work a step, a rank would need over
#: 1 s more compute than 3x its peer's for three steps in a row.
BALANCED = "0.25"


def slow_job(model: Path, out: Path, where: str, steps: int, value: str = SLEEP, fails: bool = False,
             rank: str = "1") -> list[dict]:
    """A job whose rank ``rank`` (or every rank: ``all``) is slow at ``where`` (or killed), with the
    embedded relay; the events of its journal."""
    cmd = torchrun(free_port())[:-2] + [str(JOB), rank, where, value, "--"]
    done = run_trainer(cmd + seed_flags(model, out, steps=steps, eval_steps=None))
    assert (done.returncode != 0) == fails, done.stderr[-3000:]
    return read_jsonl(out / "training_logs.jsonl")


def cluster_of(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """The relay's per-step figures and its straggler events."""
    ours = [e for e in events if e["rank"] == RELAY_RANK]
    return ([e["data"] for e in ours if e["type"] == "metrics"],
            [e for e in ours if e["type"] == "lifecycle" and e["data"]["event"] == "straggler"])


def assert_own_work_adds_up(events: list[dict]) -> None:
    """Every rank's figures: own work is step time less the waits plus the time between steps."""
    for e in events:
        if e["stage"] == "rank" and e["rank"] != RELAY_RANK:
            d = e["data"]
            assert min(d["outside_time"], d["collective_wait"], d["outside_wait"]) >= 0, d
            assert d["own_time"] == pytest.approx(d["step_time"] - d["collective_wait"] + d["outside_time"]
                                                  - d["outside_wait"]), d


@pytest.mark.parametrize("where", ["collator", "forward"])
def test_a_slow_rank_is_named_by_its_own_work(demo_model: Path, tmp_path: Path, where: str) -> None:
    events = slow_job(demo_model, tmp_path / "out", where, steps=4)
    assert_own_work_adds_up(events)
    figures, stragglers = cluster_of(events)
    assert len(figures) == 4 and all(f["own_slowest_rank"] == 1 for f in figures), figures
    (straggler,) = stragglers
    assert straggler["step"] == 3, "named within 3 logged steps"
    assert straggler["data"]["rank"] == 1 and straggler["data"]["by"] == "own_time"
    assert straggler["data"]["ratio"] > 1.5
    # Step times say nothing: DDP levels them (the peer waits for rank 1 inside or before its step).
    assert statistics.median(f["step_time_spread"] for f in figures) < 1.2, figures
    rank0 = [e["data"] for e in events if e["stage"] == "rank" and e["rank"] == 0]
    wait = "outside_wait" if where == "collator" else "collective_wait"
    assert statistics.median(d[wait] for d in rank0) > float(SLEEP), rank0  # rank 0 waited where rank 1 was late


def test_a_balanced_run_names_no_straggler(demo_model: Path, tmp_path: Path) -> None:
    """Both ranks do the same work, most of it a sleep in the data collator (BALANCED)."""
    events = slow_job(demo_model, tmp_path / "out", "collator", steps=30, value=BALANCED, rank="all")
    assert_own_work_adds_up(events)
    figures, stragglers = cluster_of(events)
    assert len(figures) == 30 and all("own_time_median" in f for f in figures)
    assert stragglers == []
    assert not [e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "rank_lost"]


def test_a_rank_killed_mid_run_is_lost_when_the_job_ends_without_it(demo_model: Path, tmp_path: Path) -> None:
    events = slow_job(demo_model, tmp_path / "out", "kill", steps=12, value="5", fails=True)
    steps = {rank: max(e["step"] for e in events if e["stage"] == "rank" and e["rank"] == rank) for rank in (0, 1)}
    assert steps == {0: 5, 1: 4}, steps  # rank 1 died before reporting step 5; rank 0 did not get past it
    (end,) = [e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "train_end"]
    assert (end["rank"], end["data"]["status"]) == (0, "failed")
    lost = [e for e in events if e["rank"] == RELAY_RANK and e["type"] == "lifecycle"
            and e["data"]["event"] == "rank_lost"]
    assert [(e["step"], e["data"]["rank"], e["data"]["why"], e["data"]["last_step"], e["data"]["peers_step"])
            for e in lost] == [(5, 1, "ended", 4, 5)], lost
