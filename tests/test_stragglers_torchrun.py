"""Stragglers that DDP hides, in real two-rank torchrun jobs (CPU, gloo) on the demo model: rank 1
made slow between steps (its data collator) or inside them (its forward pass) by
tests/slow_rank_job.py is named the straggler by its own work while the ranks' step times stay
level, a balanced run names none, and a rank SIGKILLed mid-run is named lost when the job ends
without it (its peer blocks at the next collective, so nobody goes on). Each is a run of its own in
one launch that every straggler test shares (tests/straggler_runs.py)."""
from __future__ import annotations

import statistics

import pytest
from straggler_runs import SLEEP, Run, straggler_runs
from trainer_fixtures import demo_model

from sinks.events import RELAY_RANK

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # the first test to ask runs the shared launch
__all__ = ["demo_model", "straggler_runs"]  # fixtures, used by name


def completed(run: Run) -> list[dict]:
    """The events of a run that both ranks finished (``main`` returned 0: the exit status of a job of its own)."""
    assert run.statuses == {0: 0, 1: 0}, (run.statuses, run.stderr)
    return run.events()


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
def test_a_slow_rank_is_named_by_its_own_work(straggler_runs: dict[str, Run], where: str) -> None:
    events = completed(straggler_runs[where])
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


def test_a_balanced_run_names_no_straggler(straggler_runs: dict[str, Run]) -> None:
    """Both ranks do the same work, most of it a sleep in the data collator (straggler_runs.BALANCED)."""
    events = completed(straggler_runs["balanced"])
    assert_own_work_adds_up(events)
    figures, stragglers = cluster_of(events)
    assert len(figures) == 30 and all("own_time_median" in f for f in figures)
    assert stragglers == []
    assert not [e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "rank_lost"]


def test_a_rank_killed_mid_run_is_lost_when_the_job_ends_without_it(straggler_runs: dict[str, Run]) -> None:
    killed = straggler_runs["killed"]
    assert killed.returncode != 0 and 1 not in killed.statuses, (killed.returncode, killed.statuses, killed.stderr)
    events = killed.events()
    steps = {rank: max(e["step"] for e in events if e["stage"] == "rank" and e["rank"] == rank) for rank in (0, 1)}
    assert steps == {0: 5, 1: 4}, steps  # rank 1 died before reporting step 5; rank 0 did not get past it
    (end,) = [e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "train_end"]
    assert (end["rank"], end["data"]["status"]) == (0, "failed")
    lost = [e for e in events if e["rank"] == RELAY_RANK and e["type"] == "lifecycle"
            and e["data"]["event"] == "rank_lost"]
    assert [(e["step"], e["data"]["rank"], e["data"]["why"], e["data"]["last_step"], e["data"]["peers_step"])
            for e in lost] == [(5, 1, "ended", 4, 5)], lost
